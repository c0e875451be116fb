"""The pain study across a real Flower deployment on 127.0.0.1: a SuperLink with TLS and
SuperNode authentication, three SuperNodes (one per site), `fedcare flower run` as the
researcher. The final per-site metrics must equal the in-process simulator's bit for bit;
a site killed mid-run is reported and the run completes; an unregistered site is refused."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deployment import Deployment

from fedcare.config import to_toml
from fedcare.data.synthetic.pain import generate_pain_cohort
from fedcare.runtime.flower.processes import free_port
from fedcare.studies.pain.config import PainExperiment
from fedcare.studies.run import run_study

SITES = {"site-43": 43, "site-80": 80, "site-92": 92}


def config(root: Path, methods: list[str], **deployment) -> PainExperiment:
    return PainExperiment.model_validate({
        "title": "deployed", "seeds": [5], "methods": methods, "data": {"root": str(root)},
        "protocol": {"pretrain_subjects": [42], "subjects": sorted(SITES.values()), "image_size": 16,
                     "balance_per_class": 12, "last_session": 2},
        "train": {"lr": 0.01, "local_epochs": 1, "max_rounds": 2, "patience": 2},
        "pfdl": {"finetune_epochs": 1}, "runtime": {"threads": 1},
        "deployment": {"sites": SITES, **deployment},
    })


def records(run_dir: Path, *types: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] in types]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "unbc"
    generate_pain_cohort(root, subjects=[42, *SITES.values()], frame_scale=0.02, image_size=32)
    return root


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, cohort):
    d = Deployment(tmp_path_factory.mktemp("deploy"), [*SITES, "intruder"])
    try:
        d.start_superlink()
        for site in SITES:
            d.register(site)
            d.start_site(site, cohort)
        yield d
    finally:
        d.close()


def _run(d: Deployment, cfg: PainExperiment, name: str, timeout: float = 900):
    path = d.root / f"{name}.toml"
    path.write_text(to_toml(cfg))
    out = d.root / "runs" / name
    return d.fedcare(["flower", "run", str(path), "--federation", "test", "--out", str(out)], timeout=timeout), out


@pytest.mark.timeout(1200)
def test_fedavg_and_pfdl_across_three_sites_equal_the_simulator(deployment, cohort, tmp_path):
    cfg = config(cohort, ["F(N)", "FP(N)"])
    result, out = _run(deployment, cfg, "fedavg-pfdl")
    assert result.returncode == 0, result.stdout + result.stderr + deployment.log("superlink")
    local = run_study(cfg, tmp_path / "local")
    got, expected = records(out, "client_eval", "round"), records(local, "client_eval", "round")
    assert {r["method"] for r in expected} == {"F(N)", "FP(N)"} and len(expected) > 10
    assert got == expected  # every round's losses and every per-site test metric, bit for bit
    info = json.loads((out / "run.json").read_text())
    assert info["sites"] == SITES and info["missed"] == []
    assert "Report:" in result.stdout
    # each site kept its private state on its own disk (PFDL's dense layers)
    for site in SITES:
        assert list((deployment.root / "state" / site).glob("run-*/client-*.pt")), site


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def _partial_records(out: Path) -> list[dict]:
    path = out.with_name(out.name + ".partial") / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.timeout(1200)
def test_a_site_killed_in_round_2_is_reported_and_rejoins(deployment, cohort):
    """SIGKILL site-80's SuperNode once round 1 of session 1 is done. The SuperLink notices
    after its heartbeat timeout (about a minute); until then the round waits, then goes on
    with the two sites that answered. The site is restarted and rejoins, resuming from its
    state file; the run completes and its report names the site and what it missed."""
    cfg = config(cohort, ["F(N)"], round_timeout=180, min_sites=1)
    cfg = cfg.model_copy(update={"protocol": cfg.protocol.model_copy(update={"last_session": 3})})
    path = deployment.root / "dropout.toml"
    path.write_text(to_toml(cfg))
    out = deployment.root / "runs" / "dropout"
    researcher = subprocess.Popen(
        [sys.executable, "-m", "fedcare.cli", "flower", "run", str(path), "--federation", "test", "--out", str(out)],
        env=deployment.env(deployment.researcher_home), cwd=deployment.root, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_for(lambda: any(r["type"] == "round" and r["round"] == 1 for r in _partial_records(out))
                  or researcher.poll() is not None, 600, "round 1 never finished")
        deployment.kill("site-80")
        _wait_for(lambda: any(r["type"] == "missed" for r in _partial_records(out)) or researcher.poll() is not None,
                  300, "the miss was never recorded")
        deployment.start_site("site-80", cohort)  # Flower lets it back in once it has marked it offline
        output, _ = researcher.communicate(timeout=900)
    finally:
        if researcher.poll() is None:
            researcher.kill()
    assert researcher.returncode == 0, output
    info = json.loads((out / "run.json").read_text())
    missed = info["missed"]
    assert missed and {m["site"] for m in missed} == {"site-80"}
    assert any(m["operation"] == "fit" and m["phase"] == "session-1" and m["round"] == 2 for m in missed), missed
    session_1 = [r["clients"] for r in records(out, "round") if r["phase"] == "session-1"]
    assert session_1[1] == session_1[0] - 1  # round 2 went on without it
    last = max(r["session"] for r in records(out, "client_eval"))
    assert any(r["client"] == 80 and r["session"] == last for r in records(out, "client_eval")), "site-80 did not rejoin"
    assert "Site &#x27;site-80&#x27; did not answer" in (out / "report.html").read_text()


def test_a_site_without_a_registered_key_is_refused(deployment, cohort):
    proc = deployment.start_site("intruder", cohort)
    proc.wait(60)
    assert proc.returncode != 0
    assert "Failed to activate SuperNode" in deployment.log("intruder")


def test_a_site_that_does_not_trust_the_superlinks_certificate_is_refused(deployment, cohort):
    other = deployment.root / "other-ca"
    assert deployment.fedcare(["flower", "certs", str(other)]).returncode == 0  # a CA the SuperLink's certificate is not from
    proc = deployment.start("wrong-ca", ["flower", "supernode", "--site", "site-43", "--data-dir", str(cohort),
                                         "--state-dir", str(deployment.root / "state" / "wrong-ca"),
                                         "--superlink", f"127.0.0.1:{deployment.port}",
                                         "--root-certificates", str(other / "ca.crt"),
                                         "--auth-key", str(deployment.certs / "keys" / "site-43"),
                                         "--port", str(free_port())])
    proc.wait(120)
    assert proc.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in deployment.log("wrong-ca")
