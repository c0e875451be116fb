"""The privacy audit: what fedcare's DP-SGD costs (accuracy) and buys (against attacks), on
synthetic data, in minutes (`fedcare demo privacy_audit`).

- `config.py`: the experiment file; `methods.py`: the model, the methods and their levels;
- `data.py`: the audit's synthetic clients, and the inversion's synthetic pain frames;
- `protocol.py`: per case, training then the membership attack; then each inversion case;
- `inversion.py`: the inversion's cases (what the server observes) on the pain CNN;
- `report.py`: the two tables, the AUC plot and the reconstructions, report.html;
- `study.py`: `PrivacyAuditStudy`, what binds them for the registry.

The attacks themselves are the privacy layer's (`fedcare.privacy.audit`,
`fedcare.privacy.inversion`); docs/privacy.md explains each number and its limits.
"""

from fedcare.studies.privacy_audit.study import PrivacyAuditStudy as STUDY

__all__ = ["STUDY"]
