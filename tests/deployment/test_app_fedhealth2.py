"""FedHealth 2 with the natural split (one client per PAMAP2 subject or X-ray site folder, each
reading only its own data) through Flower's Simulation Engine (`run_simulation`, the
in-process backend of support/flower_inprocess.py) equals the in-process simulator bit for bit;
what cannot run across sites (the Dirichlet split of one pooled dataset, FedAP's pooled
pretraining) is refused before any site is contacted."""

import json
from pathlib import Path

import pytest

from fedcare.config import ConfigError
from fedcare.data.pamap2.synthetic import generate_pamap2
from fedcare.data.xray.synthetic import generate_xray
from fedcare.deployment.app import check_experiment
from fedcare.studies.fedhealth2.config import FedHealth2Experiment
from fedcare.studies.run import run_study

from support.flower_inprocess import run_experiment_on_flower


SUBJECTS = [101, 102, 103]


def natural_config(root: Path, dataset: str = "pamap2", methods=("fedavg", "fedbn", "fedap", "f-fedap"), **protocol):
    return FedHealth2Experiment.model_validate({
        "study": "fedhealth2", "seeds": [1], "methods": list(methods), "data": {"dataset": dataset, "root": str(root)},
        "protocol": {"split": "natural", "pretrain": "federated", **protocol},
        "train": {"rounds": 3, "pretrain_rounds": 2, "hidden": 16}, "options": {"ffedap_warmup_rounds": 1},
        "runtime": {"threads": 2},
    })


def records(run_dir: Path, *types: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] in types]


@pytest.fixture(scope="module")
def pamap2(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pamap2") / "PAMAP2_Dataset"
    generate_pamap2(root, seed=2, subjects=3, seconds_per_activity=6.0)
    return root


@pytest.mark.timeout(300)
def test_fedhealth2_natural_split_on_flower_equals_the_simulator(pamap2, tmp_path):
    config = natural_config(pamap2, subjects=SUBJECTS)
    local = run_study(config, tmp_path / "local")
    run_experiment_on_flower(config, tmp_path / "flower", len(SUBJECTS), "fh2.toml")
    expected = records(local, "client_eval", "round")
    assert {r["method"] for r in expected} == {"fedavg", "fedbn", "fedap", "f-fedap", "pretrain (federated)"}
    assert {r["client"] for r in expected if r["type"] == "client_eval"} == set(SUBJECTS)
    assert records(tmp_path / "flower", "client_eval", "round") == expected  # every loss and accuracy, bit for bit
    info = json.loads((tmp_path / "flower" / "run.json").read_text())
    assert info["split"] == "natural" and info["sites"] == {str(s): s for s in SUBJECTS} and info["missed"] == []
    # the preflight: each subject's windows per activity, checked against the ten the model predicts
    preflight = info["preflight"]
    assert preflight["ok"] and sorted(preflight["sites"]) == [str(s) for s in SUBJECTS]
    labels = preflight["sites"]["101"]["summary"]["splits"]["train"]["labels"]
    assert list(labels)[:3] == ["lying", "sitting", "standing"] and len(labels) == 10


def test_natural_split_reads_every_subject_and_xray_site_folder_in_process(pamap2, tmp_path):
    run = run_study(natural_config(pamap2, methods=["fedbn"]), tmp_path / "pamap2")
    assert {r["client"] for r in records(run, "client_eval")} == set(SUBJECTS)  # every subject under data.root
    xray = tmp_path / "xray"
    generate_xray(xray, scale=0.004, image_size=64, sites=3)
    config = natural_config(xray, "xray", methods=["fedavg"])
    run = run_study(config, tmp_path / "xray-run")
    evals = records(run, "client_eval")
    assert {r["client"] for r in evals} == {"site-1", "site-2", "site-3"}
    assert json.loads((run / "run.json").read_text())["synthetic"] is True
    # the sites split the images between them: their test sets add up to half of each site's
    sizes = {r["client"]: r["n"] for r in evals if r["round"] == 0}
    assert sum(sizes.values()) == sum(round(0.5 * len(list((xray / s).rglob("*.jpg")))) for s in sizes)


@pytest.mark.parametrize("change, message", [
    ({"protocol": {"split": "dirichlet"}}, "divides one pooled dataset"),
    ({"protocol": {"split": "natural", "pretrain": "pooled"}}, r"\['fedap'\] start from a model pretrained on pooled"),
    ({"protocol": {"split": "natural", "pretrain": "federated"}}, "list the clients"),
])
def test_what_cannot_run_across_sites_is_refused(tmp_path, change, message):
    raw = {"study": "fedhealth2", "methods": ["fedbn", "fedap"], "data": {"dataset": "pamap2", "root": str(tmp_path)},
           **change}
    with pytest.raises(ConfigError, match=message):
        check_experiment(FedHealth2Experiment.model_validate(raw), "fh2.toml")
