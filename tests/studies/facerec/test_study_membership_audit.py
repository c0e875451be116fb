"""`[privacy.audit]` on the face study (fedcare.privacy.client_audit): the loss attack on every
client that trained, with a peer view for the methods whose head is global, and the membership
table in the report."""

from __future__ import annotations

from fedcare.studies.facerec.config import FacerecExperiment
from fedcare.studies.run import run_study

from support import records
from support.facerec import small_config


def test_face_audit_attacks_each_training_client_with_a_peer_view_for_global_heads_only(celeba, tmp_path):
    config = small_config(celeba, tmp_path / "cache", methods=["fedavg", "fedavg-local"])
    config = FacerecExperiment.model_validate({**config.model_dump(mode="json"),
                                               "privacy": {"audit": {"max_per_set": 10}}})
    run = run_study(config, tmp_path / "run")
    audit = records(run, "membership")
    got = {(r["method"], r["view"], r["client"]) for r in audit}
    assert got == {("fedavg", v, c) for v in ("own", "peer") for c in (1, 2, 3)} | {
        ("fedavg-local", "own", c) for c in (1, 2, 3)}  # client 4 is unseen: it trained on nothing
    assert all(0 <= r["auc"] <= 1 and 0 < r["members"] <= 10 and 0 < r["non_members"] <= 10 for r in audit)
    table = (run / "tables" / "membership.md").read_text()
    assert "its test crops of the same identities" in table and (run / "plots" / "membership_auc.png").is_file()
