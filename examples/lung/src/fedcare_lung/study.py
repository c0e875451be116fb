"""`LungStudy`: what binds the lung study for fedcare's registry. The protocol (rounds,
evaluation at every client, single-site models) and the report are fedcare's
(`RoundsStudy`); the study gives its data, its model and its task."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from fedcare.api import BINARY, LocalRuntime, RoundsStudy, SiteError

from fedcare_lung.config import LungExperiment
from fedcare_lung.data import FEATURES, FILE, LungSite, lifelines_copy, sites


class LungStudy(RoundsStudy):
    name = "lung"
    config_model = LungExperiment
    description = "one-year mortality in the NCCTG lung cancer trial (lifelines), one client per institution"
    task = BINARY
    metric = "roc_auc"
    config: LungExperiment

    def new_model(self) -> nn.Module:
        hidden = self.config.model.hidden
        return nn.Sequential(nn.Linear(len(FEATURES), hidden), nn.ReLU(), nn.Linear(hidden, 1), nn.Flatten(0))

    def _sites(self, path: Path, only: str | None = None) -> tuple[dict[str, LungSite], dict[str, int]]:
        d = self.config.data
        found, patients = sites(path, d.horizon_days, d.min_patients, d.small_sites, d.test_fraction, only)
        return found, patients.left_out

    def _file(self) -> Path:
        return self.config.data.root / FILE if self.config.data.root is not None else lifelines_copy()

    def local_runtime(self, workdir: Path, progress) -> LocalRuntime:
        path = self._file()
        found, left_out = self._sites(path)
        counts = ", ".join(f"{c} {len(s.y)}" for c, s in found.items())
        why = "; ".join(f"{n} {reason}" for reason, n in left_out.items() if n)
        return LocalRuntime(found, self.composed.algorithm, synthetic=False, notes=[
            f"Data: {path} ({sum(len(s.y) for s in found.values())} patients of known one-year status in "
            f"{len(found)} clients: {counts}; left out: {why or 'none'}). Institutions with fewer than "
            f"{self.config.data.min_patients} such patients are "
            + ("one client, 'other'." if self.config.data.small_sites == "merge" else "left out.")])

    def clients(self) -> list[str]:
        """The clients `[deployment.sites]` names, else those of the data on this machine."""
        listed = list(self.config.deployment.sites.values())
        return sorted(map(str, listed)) if listed else sorted(self._sites(self._file())[0])

    def open_site(self, site: str, data_dir: Path, cache_dir: Path | None = None) -> LungSite:
        """A site reads its own patients from `data_dir/lung.csv`."""
        client = self.site_client(site)
        if not Path(data_dir).is_dir():
            raise SiteError(f"site {site!r}: data directory {data_dir} does not exist")
        return self._sites(Path(data_dir) / FILE, only=client)[0][client]
