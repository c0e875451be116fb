"""The surgical and face-verification studies across a real Flower deployment on 127.0.0.1:
one SuperLink with TLS and SuperNode authentication, four SuperNodes (one per site, each with
its own warm launcher and state folder), `fedcare flower run` as the researcher. Each study's
records must equal the in-process simulator's bit for bit, and its report must carry the
sites' preflight. One deployment serves both studies: every site's data folder holds a
synthetic CelebA copy with synthetic Cholec80 and HeiChole copies beside it (`cholec80/`,
`heichole/`), and each experiment's [deployment.sites] says which client a site is. (The pain
study's deployment, with a killed site and refused nodes: test_cli_deployed_pain.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedcare.config import Experiment, to_toml
from fedcare.data.celeba.synthetic import generate_celeba
from fedcare.data.surgical.synthetic import generate_surgical
from fedcare.studies.run import run_study

from support.deployment import Deployment
from support.facerec import small_config
from support.surgical import SYNTH, tiny

pytestmark = pytest.mark.deploy  # real SuperLink and SuperNodes


SITES = ["site-1", "site-2", "site-3", "site-4"]
SURGICAL_CLIENTS = ["HEI1", "HEI2", "CHO1", "CHO2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """One folder every site reads: CelebA at its root, cholec80/ and heichole/ beside it."""
    root = tmp_path_factory.mktemp("studies") / "data"
    generate_celeba(root, seed=1, identities=14, images_per_identity=12, workers=1)
    surgical = root.parent / "surgical"
    generate_surgical(surgical, **SYNTH)
    for name in ("cholec80", "heichole"):
        shutil.move(surgical / name, root / name)
    return root


def surgical_config(data: Path, cache: Path):
    config = tiny(data, cache, methods=["fedavg", "fedrep"])
    return config.model_copy(update={"clients": SURGICAL_CLIENTS, "deployment": config.deployment.model_copy(
        update={"sites": dict(zip(SITES, SURGICAL_CLIENTS))})})


def face_config(data: Path, cache: Path):
    config = small_config(data, cache, methods=["hfmaml-local"])  # local ArcFace heads of each site's size
    return config.model_copy(update={
        "data": config.data.model_copy(update={"identities": 10}),  # clients of 3, 3, 2, 2 identities
        "deployment": config.deployment.model_copy(update={"sites": {s: i + 1 for i, s in enumerate(SITES)}})})


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, data):
    d = Deployment(tmp_path_factory.mktemp("deploy-studies"), SITES)
    try:
        d.start_superlink()
        d.register(*SITES)
        for site in SITES:
            d.start_site(site, data)
        yield d
    finally:
        d.close()


class Run:
    """One `fedcare flower run` started in the background (the researcher's process)."""

    def __init__(self, d: Deployment, config: Experiment, name: str, *extra: str):
        path = d.root / f"{name}.toml"
        path.write_text(to_toml(config))
        self.config, self.out, self.log = config, d.root / "runs" / name, d.root / f"researcher-{name}.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fedcare.cli", "flower", "run", str(path), "--federation", "test",
                 "--out", str(self.out), "--site-keys", str(d.certs / "keys"), *extra],
                env=d.env(d.researcher_home), cwd=d.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, d: Deployment) -> str:
        """The researcher's output, once its run completed (fails the test otherwise)."""
        self.process.wait(900)
        output = self.log.read_text()
        assert self.process.returncode == 0, output + d.log("superlink")
        return output


@pytest.fixture(scope="module")
def runs(deployment, data, tmp_path_factory) -> dict[str, Run]:
    """Every deployed run of this module, started at once: they spend most of their time waiting
    on Flower's polls (a SuperNode serves several runs, each in its own ClientApp processes),
    and each test waits for its own. Each run's simulator reference is computed meanwhile."""
    cache = tmp_path_factory.mktemp("caches")
    started = {"surgical": Run(deployment, surgical_config(data, cache / "surgical"), "surgical"),
               "face": Run(deployment, face_config(data, cache / "face"), "face"),
               "face-preflight": Run(deployment, face_config(data, cache / "face"), "face-preflight", "--preflight-only")}
    try:
        yield started
    finally:
        for run in started.values():
            if run.process.poll() is None:
                os.killpg(run.process.pid, signal.SIGKILL)
                run.process.wait(10)


def _records(run_dir: Path, *types: str) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["type"] in types]


def _check_deployed(d: Deployment, out: Path, expected: list[dict], kinds: tuple[str, ...], clients: list) -> dict:
    assert _records(out, *kinds) == expected  # every loss and every per-site metric, bit for bit
    info = json.loads((out / "run.json").read_text())
    assert info["runtime"] == "flower" and info["sites"] == dict(zip(SITES, clients)) and info["missed"] == []
    assert info["preflight"]["ok"] and sorted(info["preflight"]["sites"]) == SITES
    assert "Preflight: 4 sites checked their data" in (out / "report.html").read_text()
    for site in SITES:  # every message answered by the site's warm launcher
        log = d.log(site)
        assert "fedcare ClientApp launcher" in log and "Start `flwr-clientapp` process" not in log, site
    return info


@pytest.mark.timeout(1200)
def test_surgical_across_four_sites_equals_the_simulator(deployment, runs, tmp_path):
    run = runs["surgical"]
    kinds = ("client_eval", "round", "client_update")
    expected = _records(run_study(run.config, tmp_path / "simulated"), *kinds)
    assert {r["method"] for r in expected} == {"fedavg", "fedrep"} and len(expected) > 30
    run.wait(deployment)
    info = _check_deployed(deployment, run.out, expected, kinds, SURGICAL_CLIENTS)
    summary = info["preflight"]["sites"]["site-3"]["summary"]["splits"]["train"]  # CHO1: 8 training frames
    assert summary["examples"] == 8 and summary["labels"]["Grasper"] == 5 and summary["labels"]["Clipper"] == "<5"
    # FedRep's personal head stayed at each site, in its own state folder
    for site in SITES:
        assert list((deployment.root / "state" / site).glob("run-*/client-*.pt")), site


@pytest.mark.timeout(1200)
def test_face_verification_across_four_sites_equals_the_simulator(deployment, runs, tmp_path):
    run, check = runs["face"], runs["face-preflight"]
    kinds = ("client_eval", "round")
    expected = _records(run_study(run.config, tmp_path / "simulated"), *kinds)
    assert [r["clients"] for r in expected if r["type"] == "round"] == [3, 3]  # client 4 is unseen: never trains
    output = check.wait(deployment)
    folder = check.out.with_name(check.out.name + ".preflight")  # --out itself stays free for the run it checks for
    preflight = json.loads((folder / "preflight.json").read_text())
    assert preflight["ok"] and not (folder / "metrics.jsonl").exists() and not check.out.exists()  # nothing trained
    assert {s: v["summary"]["dataset"] for s, v in preflight["sites"].items()} == {
        s: {"global_identities": 10} for s in SITES}
    assert "site-4 (4): train" in output and "Preflight passed" in output
    run.wait(deployment)
    info = _check_deployed(deployment, run.out, expected, kinds, [1, 2, 3, 4])
    assert info["unseen"] == [4]
