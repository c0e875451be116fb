"""The toy study of support/toy_study, as a study from outside fedcare uses it: copied into a
folder of its own, registered in FEDCARE_STUDIES (the `toy` fixture of tests/studies/conftest.py),
its experiment files written here."""

from __future__ import annotations

import json
from pathlib import Path


from fedcare.studies.load import load_config
from fedcare.studies.run import run_study

from support import records
from support.flower_inprocess import run_experiment_on_flower

TOY_STUDY = Path(__file__).parent / "toy_study"  # the package `fedcare_toy`
CLIENTS = 3


def write_experiment(path: Path, **data) -> Path:
    table = "".join(f"{k} = {json.dumps(str(v)) if isinstance(v, Path) else v}\n" for k, v in data.items())
    path.write_text('study = "toy"\ntitle = "toy"\nseeds = [3]\nmethods = ["fedavg", "local"]\nrounds = 3\n'
                    f"[data]\nclients = {CLIENTS}\n{table}")
    return path


def toy_both_ways(tmp_path: Path, extra: str = "") -> tuple[list[dict], list[dict]]:
    """The toy experiment (`extra`: TOML appended to it) on generated data in
    tmp_path/data, run on Flower's Simulation Engine into tmp_path/flower (the sites' state
    folders in tmp_path/state) and in the simulator into tmp_path/local; their client_eval and
    round records (Flower's, the simulator's)."""
    from fedcare_toy.data import generate

    path = write_experiment(tmp_path / "toy.toml", root=generate(tmp_path / "data", CLIENTS, 4, 12))
    path.write_text(path.read_text() + extra)
    config = load_config(path)
    local = run_study(config, tmp_path / "local")
    run_experiment_on_flower(config, tmp_path / "flower", CLIENTS, "toy.toml", state_dir=tmp_path / "state")
    return records(tmp_path / "flower", "client_eval", "round"), records(local, "client_eval", "round")
