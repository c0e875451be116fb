"""The surgical tool-presence study (Markert, "Investigation of Federated Learning on
multicentric surgical video data", MSc thesis, NCT Dresden 2022): five clients (HEI1, HEI2 from
HeiChole; CHO1-CHO3 from Cholec80), AlexNet / VGG-13, FedAvg, FedProx, FedDyn, FedDG and FedRep
under a server AdamW, against CENT and LOT (ALTV / EGOV).

- `config.py`: the experiment file; `models.py`: AlexNet, VGG-13, loading a weights file;
- `data.py`: the clients' frames as sites (`SurgicalSite`, `FrameStack`);
- `methods.py`: the methods and their algorithms; `updates.py`: CosSim and GradDiff;
- `protocol.py`: the rounds and per-round evaluation at every client;
- `report.py`: Tables A.1, A.2, 6.1, the curves, report.html;
- `study.py`: `SurgicalStudy`, what binds them for the registry.
"""

from fedcare.studies.surgical.study import SurgicalStudy as STUDY

__all__ = ["STUDY"]
