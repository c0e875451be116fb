"""`[privacy.audit]` on the pain study (fedcare.studies.pain.audit): the config section, the
membership records of a tiny run for each method and view, the member / non-member frames as
documented, the report's table, and the refusal on Flower."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.config import ConfigError, MembershipAudit, Privacy, Runtime
from fedcare.studies.load import load_config
from fedcare.seeding import numpy_rng
from fedcare.studies.pain.audit import membership_items
from fedcare.studies.pain.cohort import PainSite, TrainingSet, balance_items, items_data, read_cohort
from fedcare.studies.run import run_study
from fedcare.studies.rundir import SYNTHETIC_DIR

from support import ROOT
from support.pain import small_config


CONFIGS = ROOT / "configs"
METHODS = ["F(N)", "FP(N)", "FL(N)", "FBN(N)"]
SEED, UPTO = 5, 1  # small_config: seed 5, last_session 3, so the last training set is train/5/1


def audit_config(**audit):
    return small_config().model_copy(update={"methods": METHODS, "privacy": Privacy(audit=MembershipAudit(**audit)),
                                             "runtime": Runtime(threads=1)})  # one thread: fastest on shared cores


@pytest.fixture(scope="module")
def audit_run(tmp_path_factory) -> Path:
    return run_study(audit_config(), tmp_path_factory.mktemp("audit") / "run")


def membership(run_dir: Path) -> list[dict]:
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r for r in records if r["type"] == "membership"]


def test_the_config_section_validates_and_names_a_bad_key(tmp_path):
    path = CONFIGS / "pain" / "privacy-audit.toml"
    config = load_config(path)
    assert config.privacy.audit == MembershipAudit(max_per_set=200, server_epochs=3)
    assert config.methods == METHODS
    with pytest.raises(ConfigError, match=r"^--set privacy\.audit\.rounds=3: privacy\.audit\.rounds: unknown key"):
        load_config(path, ["privacy.audit.rounds=3"])
    with pytest.raises(ConfigError, match=r"privacy\.audit\.max_per_set: Input should be greater than or equal to 10"):
        load_config(path, ["privacy.audit.max_per_set=2"])
    with pytest.raises(ConfigError, match="privacy.audit: the fedhealth2 study has no membership audit"):
        load_config(CONFIGS / "fedhealth2" / "demo.toml", ["privacy.audit.max_per_set=50"])
    result = CliRunner().invoke(app, ["run", str(path), "--set", "privacy.audit.rounds=3", "--out", str(tmp_path / "r")])
    assert result.exit_code != 0 and "privacy.audit.rounds" in result.output and "Traceback" not in result.output


def test_every_method_and_view_has_membership_records(audit_run):
    records = membership(audit_run)
    views = {(r["method"], r["view"]) for r in records}
    expected = {(m, v) for m in METHODS for v in ("own", "peer", "server")} - {("FL(N)", "server")}  # FL shares nothing
    assert views == expected
    for r in records:
        assert 0 <= r["auc"] <= 1 and 0 <= r["tpr_at_1pct_fpr"] <= 1 and r["auc_se"] > 0
        assert r["members"] == r["non_members"] > 0
        assert r["seed"] == SEED
    peers = [r for r in records if r["view"] == "peer"]
    assert peers and all(r["peer"] != r["client"] for r in peers)
    # FedAvg: every view is the global model; local: a peer never saw the victim, so it differs from own
    by = {(r["method"], r["view"], r["client"]): r["auc"] for r in records}
    for (m, v, c), auc in by.items():
        if m == "F(N)":
            assert auc == by[("F(N)", "own", c)]
    assert any(by[("FL(N)", "peer", c)] != by[("FL(N)", "own", c)] for (m, v, c) in by if m == "FL(N)")


def test_members_and_non_members_are_the_documented_frames(audit_run):
    config = audit_config()
    cohort = read_cohort(config, audit_run / SYNTHETIC_DIR, config.protocol.subjects)
    audited = {r["client"]: r["members"] for r in membership(audit_run) if r["method"] == "F(N)" and r["view"] == "own"}
    assert audited
    for subject, count in audited.items():
        site = PainSite(subject, cohort.sessions[subject], config.protocol.balance_per_class, True)
        members, non_members = membership_items(site, SEED, UPTO, max_per_set=200)
        assert len(members) == len(non_members) == count
        trained = balance_items(site.sessions, UPTO, site.per_class, numpy_rng(SEED, "balance", subject, UPTO))
        # the draw is the one the client trained on: the same frames PainSite hands out as TrainingSet(5, 1)
        assert items_data(site.sessions, trained).x[:].equal(site.data(TrainingSet(SEED, UPTO)).x[:])
        rows = {tuple(r) for r in trained}
        assert {tuple(r) for r in members} <= rows and len({tuple(r) for r in members}) == len(members)
        ever = {(s, f) for u in range(UPTO + 1)
                if (d := balance_items(site.sessions, u, site.per_class, numpy_rng(SEED, "balance", subject, u)))
                is not None for s, f, _ in d}
        assert not {(s, f) for s, f, _ in non_members} & ever  # no variant of a non-member frame was trained on
        assert set(non_members[:, 0]) <= set(trained[:, 0])  # same sessions as the training set
        assert strata(site, members) == strata(site, non_members)  # as many per (session, label)
        capped_m, capped_n = membership_items(site, SEED, UPTO, max_per_set=10)
        assert len(capped_m) == len(capped_n) == min(10, count) and strata(site, capped_m) == strata(site, capped_n)


def strata(site: PainSite, rows) -> list[tuple[int, int]]:
    """The (session, label) of each item, sorted."""
    return sorted((s, int(site.sessions[s].labels[f])) for s, f, _ in rows)


def test_the_report_has_the_membership_table_and_plot(audit_run):
    table = (audit_run / "tables" / "membership.md").read_text()
    for method in METHODS:
        assert f"| {method} | own (device breach) | inf |" in table
    assert "| FL(N) | server (shared tensors) | inf | 0 | n/a |" in table
    html = (audit_run / "report.html").read_text()
    assert "Membership inference audit (loss attack)" in html and "lower bound" in html and "synthetic" in html
    assert (audit_run / "plots" / "membership_auc.png").stat().st_size > 1000


def test_the_audit_is_refused_on_flower():
    from fedcare.deployment.app import (
        check_experiment,  # what the ServerApp checks before contacting a site
    )

    with pytest.raises(ConfigError, match="exp.toml: privacy.audit runs in this process only"):
        check_experiment(audit_config(), "exp.toml")
    check_experiment(audit_config().model_copy(update={"privacy": None}), "exp.toml")  # without it: deployable
