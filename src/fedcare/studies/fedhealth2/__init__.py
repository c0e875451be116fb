"""The FedHealth 2 study (Chen et al. 2021; Lu et al., FedAP): personalized FL on wearables
(PAMAP2) and chest X-rays.

- `config.py`: the experiment file; `methods.py`: the methods and their algorithms;
- `data.py`: the Dirichlet and natural splits, `FedHealth2Site` (one client's data by reference);
- `protocol.py`: FedAP's pretrained start, the rounds, per-round evaluation at every client;
- `report.py`: accuracy per client and method, plots, report.html;
- `study.py`: `FedHealth2Study`, what binds them for the registry.
"""

from fedcare.studies.fedhealth2.study import FedHealth2Study as STUDY

__all__ = ["STUDY"]
