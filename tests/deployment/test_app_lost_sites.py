"""The coordinator's ServerApp (`fedcare.deployment.app.run_experiment`) with the sites of a
pain experiment in this process: fedcare's real ClientApp behind a stand-in Grid, each with its
node config and its key (support/flower_grid.py). site-43 reads its data; site-80 was started
with another site's data; site-92 is not running; a registered stranger answers `{garbage`.
The preflight fails naming both missing sites and why (it passed, listing site-43 only); a run
goes on with site-43 under `min_sites = 1` and is never called complete (it ended complete, or
stopped at the stranger's answer). The same, across real processes: test_cli_deployed_trust.py."""

import json

import pytest

from fedcare.config import to_toml
from fedcare.deployment.app import PREFLIGHT_FILE, client_app, run_experiment
from fedcare.runtime.flower.certs import make_site_key
from fedcare.runtime.preflight import PreflightError

from support.flower_grid import SitesGrid, client_app_node, stranger
from support.flower_offline import task_identity
from support.pain_sites import SITES, another_site_s_data, config, records


@pytest.fixture(scope="module")
def world(tmp_path_factory, pain_cohort):
    """The sites' keys, and site-80's data folder: subject 43's data, not its own."""
    root = tmp_path_factory.mktemp("lost-sites")
    for site in (*SITES, "stranger"):
        make_site_key(root, site)
    return root, another_site_s_data(pain_cohort, root / "site-43-data", 43)


def _grid(world, pain_cohort) -> SitesGrid:
    root, wrong = world
    node = {name: {"site": name, "auth-key": str(root / "keys" / name), "state-dir": str(root / "state" / name)}
            for name in SITES}
    return SitesGrid({101: client_app_node(client_app, 101, {**node["site-43"], "data-dir": str(pain_cohort)}),
                      102: client_app_node(client_app, 102, {**node["site-80"], "data-dir": str(wrong)}),
                      666: stranger("{garbage")})


def _run_config(world, pain_cohort, out, **deployment) -> dict:
    """F(N) over sessions 1 and 2 (two rounds), every site of support/pain_sites.py listed."""
    root, _ = world
    cfg = config(pain_cohort, ["F(N)"], connect_timeout=1, **deployment)
    keys = {s: (root / "keys" / f"{s}.pub").read_text() for s in (*SITES, "stranger")}
    return {"experiment": to_toml(cfg), "experiment-name": "lost.toml", "out": str(out), "site-keys": json.dumps(keys)}


@pytest.mark.timeout(300)
def test_a_preflight_without_every_listed_site_fails_naming_each_and_why(world, pain_cohort, tmp_path):
    out = tmp_path / "check"
    with task_identity(), pytest.raises(PreflightError) as failed:
        run_experiment(_grid(world, pain_cohort), {**_run_config(world, pain_cohort, out), "preflight-only": True})
    message = str(failed.value)
    assert "site 'site-80' (80) is missing: its greeting failed: site 'site-80': " in message
    assert "subject 80 not found" in message
    assert "site 'site-92' (92) is missing: not running (no node answered the greeting as this site)" in message
    written = json.loads((out / PREFLIGHT_FILE).read_text())
    assert written["ok"] is False and list(written["sites"]) == ["site-43"]


@pytest.mark.timeout(600)
def test_a_run_without_two_listed_sites_goes_on_and_is_not_complete(world, pain_cohort, tmp_path):
    out = tmp_path / "run"
    with task_identity():
        run_experiment(_grid(world, pain_cohort), _run_config(world, pain_cohort, out, min_sites=1))
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "finished" and info["sites"] == {"site-43": 43}
    assert info["complete"] is False and info["incomplete_sites"] == ["site-80", "site-92"]
    assert [(r["node"], r["site"]) for r in info["refused"]] == [(666, "?")]
    notes = info["notes"]
    assert any(n.startswith("Site 'site-80' was missing at the start: its greeting failed: site 'site-80': ")
               for n in notes), notes
    assert "Site 'site-92' was missing at the start: not running (no node answered the greeting as this site)." in notes
    assert any(n.startswith("Node 666 was refused: sent a malformed greeting answer: not JSON") for n in notes), notes
    assert {r["client"] for r in records(out, "client_eval")} == {43}  # the numbers are site-43's alone
    rounds = records(out, "participation")
    assert rounds and all(r["answered"] == ["site-43"] and r["late"] == r["missing"] == [] for r in rounds)
    assert "INCOMPLETE FEDERATION: site(s) site-80, site-92" in (out / "report.html").read_text()
