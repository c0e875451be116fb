"""The federated pain-recognition study (Tobis thesis, PFDL paper).

- `config.py`: the experiment file; `methods.py`: RANDOM, BC, BF, C/F/FP/FL and their algorithms;
- `cohort.py`: the cohort in memory, SessionBalancing, `PainSite` (one subject's data by reference);
- `protocol.py`: the sessions protocol and Group-1 pretraining;
- `aggregate.py`, `report.py`: the thesis's tables (7.1, 7.4-7.7), plots and report.html;
- `study.py`: `PainStudy`, what binds them for the registry.
"""

from fedcare.studies.pain.study import PainStudy as STUDY

__all__ = ["STUDY"]
