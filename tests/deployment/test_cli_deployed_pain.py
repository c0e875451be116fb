"""The pain study across a real Flower deployment on 127.0.0.1: a SuperLink with TLS and SuperNode
authentication, three SuperNodes (one per site), `fedcare flower run` as the researcher. PFDL's
per-site metrics must equal the in-process simulator's bit for bit, and FedAvg's until a site is
killed mid-run; that site is reported and the run completes; an unregistered site is refused, and
so is a registered node that claims another site's name. Each site's own record of the models
it trained on and sent agrees with the coordinator's lineage, and a SuperNode whose operator
approved an app one byte away from the one sent refuses it, and is refused in run.json. (Both methods run to the end on Flower's
Simulation Engine: test_cli_simulation_engine.py; each deployed run costs minutes of Flower's
polling.)"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedcare.config import to_toml
from fedcare.deployment.cli import app_dir
from fedcare.runfiles import read_lineage
from fedcare.runtime.flower.approval import app_digest
from fedcare.runtime.flower.certs import make_certificates
from fedcare.studies.pain.config import PainExperiment

from support.deployment import Deployment, wait_for
from support.lineage import check_lineage
from support.pain_sites import SITES, config, records

pytestmark = pytest.mark.deploy  # real SuperLink and SuperNodes


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, pain_cohort):
    """One SuperLink and the three sites' SuperNodes for every test here: starting them is a
    good part of a test's time. The two SuperNodes the SuperLink must refuse (an unregistered
    key; a site that trusts another CA, with site-43's registered key, so that only the
    certificate is wrong) are started first, so that their refusals overlap the set-up and
    the runs; their tests wait for them to end."""
    d = Deployment(tmp_path_factory.mktemp("deploy"), [*SITES, "intruder", "impostor", "unapproved"])
    try:
        # a CA the SuperLink's certificate is not from (in process: `fedcare flower certs` made d.certs)
        make_certificates(d.root / "other-ca", ["127.0.0.1", "localhost"])
        d.start_superlink()
        d.start_site("intruder", pain_cohort)
        d.start_site("site-43", pain_cohort, name="wrong-ca", root_certificates=d.root / "other-ca" / "ca.crt")
        # Flower registers any key it is given: "impostor" is let in, and claims to be site-43
        d.register(*SITES, "impostor", "unapproved")
        for site in SITES:
            d.start_site(site, pain_cohort)
        d.start_site("site-43", pain_cohort, name="impostor", auth_key=d.certs / "keys" / "impostor")
        # a site whose operator approved fedcare's app with one byte changed: the app it is sent is not that one
        d.start_site("unapproved", pain_cohort, "--approved-apps", str(_approved_one_byte_off(d.root)))
        yield d
    finally:
        d.close()


def _approved_one_byte_off(root: Path) -> Path:
    """An allow-list naming fedcare's app with one byte of its pyproject.toml changed."""
    app = shutil.copytree(app_dir(), root / "approved-app")
    toml = app / "pyproject.toml"
    toml.write_text(toml.read_text().replace('version = "0.1.0"', 'version = "0.1.1"', 1))
    allow = root / "approved-apps.txt"
    allow.write_text(f"{app_digest(app)}  fedcare's app, one byte changed\n")
    return allow


def _run(d: Deployment, cfg: PainExperiment, name: str, timeout: float = 900):
    path = d.root / f"{name}.toml"
    path.write_text(to_toml(cfg))
    out = d.root / "runs" / name
    return d.fedcare(["flower", "run", str(path), "--federation", "test", "--out", str(out),
                      "--site-keys", str(d.certs / "keys")], timeout=timeout), out


@pytest.mark.timeout(1200)
def test_pfdl_across_three_sites_equals_the_simulator(deployment, pain_cohort, pain_reference):
    result, out = _run(deployment, config(pain_cohort, ["FP(N)"]), "pfdl")
    assert result.returncode == 0, result.stdout + result.stderr + deployment.log("superlink")
    # every round's losses and every per-site test metric, bit for bit (conftest.py)
    expected = [r for r in pain_reference if r["method"] == "FP(N)"]
    assert len(expected) > 5 and records(out, "client_eval", "round") == expected
    info = json.loads((out / "run.json").read_text())
    assert info["sites"] == SITES and info["missed"] == []
    # the impostor node (a registered key, not site-43's) was refused: site-43 kept its node; and the node
    # that runs only an app one byte away from the one sent refused it, before any of it ran
    refused = sorted((r["site"], r["reason"]) for r in info["refused"])
    assert refused[1] == ("site-43", "its signature does not match site-43.pub (it does not hold the site's key)")
    assert refused[0][0] == "?" and "answered the greeting with an error" in refused[0][1]
    assert f"this site runs only approved apps: the app it was sent (sha256 {app_digest(app_dir())})" in refused[0][1]
    assert "fedcare: refused an app: this site runs only approved apps" in deployment.log("unapproved")
    # the lineage of every aggregate holds, and each site's own record of what it trained on agrees with it
    check_lineage(out)
    trained = {}
    for site in SITES:  # a site whose subject has no training session in the protocol trains on nothing
        compared = deployment.fedcare(["flower", "site-record", str(deployment.root / "state" / site),
                                       "--lineage", str(out)])
        assert compared.returncode == 0, compared.stdout + compared.stderr
        sent = re.search(r"client \d+: (\d+) updates sent; (\d+) in the lineage's aggregates as sent", compared.stdout)
        assert sent and sent.group(1) == sent.group(2), compared.stdout
        trained[site] = int(sent.group(1))
        assert "the fedcare code the site ran: the coordinator's (same digest)" in compared.stdout or not trained[site]
        assert "the site's record and the coordinator's lineage agree" in compared.stdout
    in_lineage = {c for r in read_lineage(out) if r["type"] == "aggregate" for c in r["clients"]}
    assert {s for s, n in trained.items() if n} == {s for s, c in SITES.items() if str(c) in in_lineage} != set()
    assert "A node claiming site &#x27;site-43&#x27; was refused" in (out / "report.html").read_text()
    # every SuperNode runs on this machine, with the experiment's one thread: they compute alike
    assert {s: (f["threads"], f["cpu_kernels"]) for s, f in info["site_compute"].items()} == {
        s: (1, torch.backends.cpu.get_cpu_capability()) for s in SITES}
    assert not any("do not compute alike" in n for n in info["notes"])
    assert "Report:" in result.stdout
    # each site kept its private state on its own disk (PFDL's dense layers)
    for site in SITES:
        assert list((deployment.root / "state" / site).glob("run-*/client-*.pt")), site
    # every message was answered in a process forked from the site's warm launcher, none by
    # Flower's flwr-clientapp (which logs its start into the SuperNode's output)
    for site in SITES:
        log = deployment.log(site)
        assert "fedcare ClientApp launcher" in log and "Start `flwr-clientapp` process" not in log, site


def _partial_records(out: Path) -> list[dict]:
    path = out.with_name(out.name + ".partial") / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.timeout(1200)
def test_a_site_killed_in_round_2_is_reported_and_rejoins(deployment, pain_cohort, pain_reference):
    """SIGKILL site-80's SuperNode once round 1 of session 1 is done. The SuperLink notices
    after its heartbeat timeout (about 20 s with the tests' 10 s heartbeat: support/deployment.py;
    about a minute with Flower's default); until then the round waits, then goes on
    with the two sites that answered. The site is restarted and rejoins, resuming from its
    state file; the run completes and its report names the site and what it missed. Until the
    kill, the records equal the simulator's bit for bit: FedAvg's deployed equality check."""
    cfg = config(pain_cohort, ["F(N)"], round_timeout=180, min_sites=1)
    cfg = cfg.model_copy(update={"protocol": cfg.protocol.model_copy(update={"last_session": 3})})
    path = deployment.root / "dropout.toml"
    path.write_text(to_toml(cfg))
    out = deployment.root / "runs" / "dropout"
    researcher = subprocess.Popen(
        [sys.executable, "-m", "fedcare.cli", "flower", "run", str(path), "--federation", "test", "--out", str(out),
         "--site-keys", str(deployment.certs / "keys")],
        env=deployment.env(deployment.researcher_home), cwd=deployment.root, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: any(r["type"] == "round" and r["round"] == 1 for r in _partial_records(out))
                  or researcher.poll() is not None, 600, "round 1 never finished")
        deployment.kill("site-80")
        wait_for(lambda: any(r["type"] == "missed" for r in _partial_records(out)) or researcher.poll() is not None,
                  300, "the miss was never recorded")
        deployment.start_site("site-80", pain_cohort)  # Flower lets it back in once it has marked it offline
        output, _ = researcher.communicate(timeout=900)
    finally:
        if researcher.poll() is None:
            researcher.kill()
        if "site-80" not in deployment.processes:  # failed between kill and restart: the other tests need all sites
            deployment.start_site("site-80", pain_cohort)
    assert researcher.returncode == 0, output
    # the session-1 tests and round 1 of session 1 ran before the kill: the simulator's records
    before_kill = records(out, "client_eval", "round")[:len(SITES) + 1]
    kinds = [(r["type"], r.get("session"), r.get("round")) for r in before_kill]
    assert kinds == [("client_eval", 1, None)] * len(SITES) + [("round", None, 1)]
    assert before_kill == [r for r in pain_reference if r["method"] == "F(N)"][:len(SITES) + 1]
    info = json.loads((out / "run.json").read_text())
    missed = info["missed"]
    assert missed and {m["site"] for m in missed} == {"site-80"}
    assert any(m["operation"] == "fit" and m["phase"] == "session-1" and m["round"] == 2 for m in missed), missed
    session_1 = [r["clients"] for r in records(out, "round") if r["phase"] == "session-1"]
    assert session_1[1] == session_1[0] - 1  # round 2 went on without it
    last = max(r["session"] for r in records(out, "client_eval"))
    assert any(r["client"] == 80 and r["session"] == last for r in records(out, "client_eval")), "site-80 did not rejoin"
    assert "Site &#x27;site-80&#x27; did not answer" in (out / "report.html").read_text()


def test_a_site_without_a_registered_key_is_refused(deployment):
    proc = deployment.processes["intruder"]  # started by the fixture, with the sites
    proc.wait(120)
    assert proc.returncode != 0
    assert "Failed to activate SuperNode" in deployment.log("intruder")


def test_a_site_that_does_not_trust_the_superlinks_certificate_is_refused(deployment):
    proc = deployment.processes["wrong-ca"]  # started by the fixture: site-43's key, another CA's ca.crt
    proc.wait(120)
    assert proc.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in deployment.log("wrong-ca")
