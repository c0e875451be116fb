"""fedcare-lung: a fedcare study from outside fedcare, on real multi-site clinical data.

One-year mortality of patients with advanced lung cancer in the North Central Cancer
Treatment Group trial (Loprinzi et al., J Clin Oncol 1994), as the `lifelines` package ships
it: each institution is a client, a small MLP on the clinical covariates. Everything else
(the rounds, per-client evaluation, single-site models, the report) is fedcare's, through
`fedcare.api`.

- `config.py`: the experiment file; `data.py`: the patients, the clients, a site's data;
- `study.py`: `LungStudy`; `demo.toml`: what `fedcare demo lung` runs.
"""

from fedcare_lung.study import LungStudy as STUDY

__all__ = ["STUDY"]
