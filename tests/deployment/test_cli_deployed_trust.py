"""No stranger stops a run and no site is lost without a word, across a real Flower deployment
on 127.0.0.1 (a SuperLink with TLS and SuperNode authentication, `fedcare flower run` as the
researcher). The pain experiment lists three sites: site-43 runs with its data; site-80 was
started with another site's data (subject 43's, not its own); site-92 is not running; and a
stranger, registered with its own key as Flower lets anyone do, runs modified code that answers
every greeting with `{garbage` (before, that stopped every run after 15 s). A run with
`min_sites = 1` goes on with site-43, names each of the others and why, and is not complete;
the preflight of the same experiment fails naming both missing sites. Both start at once on
the one deployment. (The same in process, faster: test_app_lost_sites.py.)"""

import json
import subprocess
import sys

import pytest

from fedcare.config import to_toml

from support.deployment import TESTS, Deployment, wait_for
from support.pain_sites import SITES, another_site_s_data, config

pytestmark = pytest.mark.deploy  # real SuperLink and SuperNodes


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, pain_cohort):
    d = Deployment(tmp_path_factory.mktemp("deploy-trust"), [*SITES, "stranger"])
    try:
        d.start_superlink()
        d.register("site-43", "site-80", "stranger")  # site-92 never comes
        d.start_site("site-43", pain_cohort)
        d.start_site("site-80", another_site_s_data(pain_cohort, d.root / "subject-43", 43))
        d.start_site("stranger", pain_cohort, "--preload", "support.stranger_clientapp", path=(TESTS,))
        for name in ("site-43", "site-80", "stranger"):  # warm: each answers its greeting at once
            wait_for(lambda: "fedcare ClientApp launcher: imported" in d.log(name), 300, f"{name} never started")
        yield d
    finally:
        d.close()


def _start(d: Deployment, pain_cohort, name: str, *extra: str) -> tuple[subprocess.Popen, object]:
    """`fedcare flower run` of F(N) over sessions 1 and 2 (one round), in the background."""
    cfg = config(pain_cohort, ["F(N)"], min_sites=1, connect_timeout=30)  # site-92 is waited for that long
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"rounds": 1})})
    path = d.root / f"{name}.toml"
    path.write_text(to_toml(cfg))
    out = d.root / "runs" / name
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedcare.cli", "flower", "run", str(path), "--federation", "test", "--out", str(out),
         "--site-keys", str(d.certs / "keys"), *extra],
        env=d.env(d.researcher_home), cwd=d.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    return proc, out


@pytest.mark.timeout(1200)
def test_a_stranger_a_site_with_wrong_data_and_a_site_not_running(deployment, pain_cohort):
    run, out = _start(deployment, pain_cohort, "run")
    check, _ = _start(deployment, pain_cohort, "check", "--preflight-only")
    try:
        run_output, _ = run.communicate(timeout=900)
        check_output, _ = check.communicate(timeout=300)
    finally:
        for proc in (run, check):
            if proc.poll() is None:
                proc.kill()
    logs = "".join(deployment.log(n) for n in ("superlink", "site-43", "site-80", "stranger"))
    # the preflight stops: both listed sites that are not there are named, with why
    check_output = " ".join(check_output.split())
    assert check.returncode == 2, check_output + logs
    assert "site 'site-80' (80) is missing: its greeting failed: site 'site-80': " in check_output
    assert "subject 80 not found" in check_output
    assert "site 'site-92' (92) is missing: not running" in check_output
    # the run goes on with site-43 (min_sites = 1), and says what it lacks
    assert run.returncode == 0, run_output + logs
    assert "INCOMPLETE FEDERATION: site(s) site-80, site-92" in run_output
    info = json.loads((out / "run.json").read_text())
    assert info["complete"] is False and info["incomplete_sites"] == ["site-80", "site-92"]
    assert info["sites"] == {"site-43": 43}
    assert info["participation"]["site-43"]["answered"] >= 1 and list(info["participation"]) == ["site-43"]
    start = {m["site"]: m["reason"] for m in info["missed"] if m["operation"] == "start"}
    assert start["site-80"].startswith("its greeting failed: site 'site-80': ") and "subject 80 not found" in start["site-80"]
    assert start["site-92"] == "not running (no node answered the greeting as this site)"
    [refused] = info["refused"]  # the stranger: refused, recorded, never greeted again
    assert refused["site"] == "?" and refused["reason"].startswith("sent a malformed greeting answer: not JSON")
    assert "support.stranger_clientapp" in deployment.log("stranger")  # it did run the stranger's code
    report = (out / "report.html").read_text()
    assert "Site &#x27;site-92&#x27; was missing at the start: not running" in report
    assert f"Node {refused['node']} was refused: sent a malformed greeting answer" in report
