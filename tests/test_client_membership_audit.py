"""`[privacy.audit]` on the surgical and face studies (fedcare.privacy.client_audit): the loss
attack on every client that trained, own and peer views as each study allows, the membership
table in the report, and the audit's refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fedcare.algorithms.training import ClientData
from fedcare.config import ConfigError, MembershipAudit
from fedcare.privacy.client_audit import ClientMembershipAudit
from fedcare.studies.facerec.config import FacerecExperiment
from fedcare.studies.run import run_study
from fedcare.studies.surgical.config import SurgicalExperiment

sys.path.insert(0, str(Path(__file__).parent))
from test_facerec import celeba, one_thread, small_config  # noqa: E402,F401  (fixtures: synthetic CelebA)
from test_surgical_study import cache, synth, tiny  # noqa: E402,F401  (fixtures: synthetic videos)


def membership(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == "membership"]


def test_face_audit_attacks_each_training_client_with_a_peer_view_for_global_heads_only(celeba, tmp_path):  # noqa: F811
    config = small_config(celeba, tmp_path / "cache", methods=["fedavg", "fedavg-local"])
    config = FacerecExperiment.model_validate({**config.model_dump(mode="json"),
                                               "privacy": {"audit": {"max_per_set": 10}}})
    run = run_study(config, tmp_path / "run")
    got = {(r["method"], r["view"], r["client"]) for r in membership(run)}
    assert got == {("fedavg", v, c) for v in ("own", "peer") for c in (1, 2, 3)} | {
        ("fedavg-local", "own", c) for c in (1, 2, 3)}  # client 4 is unseen: it trained on nothing
    assert all(0 <= r["auc"] <= 1 and 0 < r["members"] <= 10 and 0 < r["non_members"] <= 10 for r in membership(run))
    table = (run / "tables" / "membership.md").read_text()
    assert "its test crops of the same identities" in table and (run / "plots" / "membership_auc.png").is_file()


def test_surgical_audit_covers_the_fl_methods_not_cent_or_lot(synth, cache, tmp_path):  # noqa: F811
    config = tiny(synth, cache, methods=["fedavg", "lot", "cent"], top={"privacy": {"audit": {"max_per_set": 10}}})
    run = run_study(config, tmp_path / "run")
    got = {(r["method"], r["view"], r["client"]) for r in membership(run)}
    assert got == {("fedavg", v, c) for v in ("own", "peer") for c in ("HEI1", "HEI2", "CHO1", "CHO2", "CHO3")}
    assert "its test frames, which come from other videos" in (run / "tables" / "membership.md").read_text()


def test_the_audit_runs_in_process_only_and_caps_each_set():
    with pytest.raises(ConfigError, match="privacy.audit runs in this process only"):
        ClientMembershipAudit(SimpleNamespace(runtime=SimpleNamespace(sites=None)), MembershipAudit())
    audit = ClientMembershipAudit(SimpleNamespace(runtime=SimpleNamespace(sites={})), MembershipAudit(max_per_set=10))
    big, small = ClientData(torch.arange(30.0)[:, None], torch.zeros(30)), ClientData(torch.zeros(4, 1), torch.ones(4))
    members, non_members = audit.subset((big, small), 1, seed=0)
    assert len(members) == 10 and len(set(members.x[:, 0].tolist())) == 10 and len(non_members) == 4
    again, _ = audit.subset((big, small), 1, seed=0)
    assert torch.equal(again.x, members.x)  # drawn from (seed, client): the same on a resumed run
    assert SurgicalExperiment.offers_membership_audit and FacerecExperiment.offers_membership_audit
