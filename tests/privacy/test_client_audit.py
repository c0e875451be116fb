"""The membership audit of the surgical and face studies' clients (fedcare.privacy.client_audit): it
runs in this process only, and each member and non-member set is capped by a draw from (seed,
client). The audit on whole runs: tests/studies/facerec/test_study_membership_audit.py,
tests/studies/surgical/test_study_membership_audit.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fedcare.algorithms.training import ClientData
from fedcare.config import ConfigError, MembershipAudit
from fedcare.privacy.client_audit import ClientMembershipAudit
from fedcare.studies.facerec.config import FacerecExperiment
from fedcare.studies.surgical.config import SurgicalExperiment


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
