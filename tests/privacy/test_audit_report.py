"""The one-run audits in a whole study's run (fedhealth2, which has no membership audit: the
one-run audits apply to every study): epsilon-hat beside epsilon in tables/epsilon_audit, the
soundness verdict in run.json, and a run whose accountant is told more noise than was added
saying so at the top of its report, its tables and its log, never quietly."""

from __future__ import annotations

import json

import pytest

from fedcare.config import DPSGD, ClientDP, Privacy, PrivacyAudit
from fedcare.privacy import PrivacyError
from fedcare.privacy.dp_sgd import PerExampleClipNoise
from fedcare.studies import registry
from fedcare.studies.checks import check_methods
from fedcare.studies.fedhealth2.config import FedHealth2Experiment
from fedcare.studies.run import run_study


def config(privacy: Privacy) -> FedHealth2Experiment:
    return FedHealth2Experiment.model_validate({
        "study": "fedhealth2", "seeds": [1], "methods": ["fedavg"],
        "data": {"dataset": "pamap2", "synthetic": {"subjects": 3, "seconds_per_activity": 6.0}},
        "protocol": {"clients": 4, "dirichlet_alpha": 1.0},
        "train": {"rounds": 3, "pretrain_epochs": 1, "hidden": 16}, "runtime": {"threads": 2},
        "privacy": privacy.model_dump(exclude_unset=True),
    })


DP_SGD = Privacy(dp_sgd=DPSGD(noise_multiplier=20.0), audit=PrivacyAudit(canaries=300))


def test_an_accountant_told_more_noise_than_was_added_makes_the_run_say_so(tmp_path, monkeypatch):
    """The ledger records sigma = 20 (epsilon 0.32 over the run) while the hook adds sigma =
    0.05: the canaries prove epsilon-hat above 2."""
    real_call = PerExampleClipNoise.__call__

    def too_little_noise(self, model, batch_size):
        self.noise_multiplier = 0.05
        return real_call(self, model, batch_size)

    monkeypatch.setattr(PerExampleClipNoise, "__call__", too_little_noise)
    out = run_study(config(DP_SGD), tmp_path / "lying")
    verdict = json.loads((out / "run.json").read_text())["privacy_audit"]
    assert verdict["sound"] is False and verdict["claims_tested"] == 5  # pooled and 4 clients
    assert len(verdict["unsound"]) == 5 and "fedavg (train), example (gradient canaries), client pooled" in \
        verdict["unsound"][0]
    page = (out / "report.html").read_text()
    assert page.index("PRIVACY AUDIT FAILED") < page.index('id="facts"')  # at the top, before the run's facts
    table = (out / "tables" / "epsilon_audit.md").read_text()
    assert table.startswith("**PRIVACY AUDIT FAILED") and "| NO |" in table
    assert "PRIVACY AUDIT CONTRADICTS THE ACCOUNTANT" in (out / "run.log").read_text()
    rows = [line.split(",") for line in (out / "tables" / "epsilon_audit.csv").read_text().splitlines()[1:]]
    assert all(float(r[5]) > 2 > 0.5 > float(r[4]) for r in rows)  # epsilon-hat, epsilon


def test_an_honest_run_is_sound_and_its_report_shows_both_numbers(tmp_path):
    out = run_study(config(DP_SGD), tmp_path / "honest")
    verdict = json.loads((out / "run.json").read_text())["privacy_audit"]
    assert verdict == {"sound": True, "claims_tested": 5, "confidence": 0.95, "unsound": []}
    page = (out / "report.html").read_text()
    assert "PRIVACY AUDIT FAILED" not in page and "Privacy audit (one run, 95% confidence): fedavg (train)" in page
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    audited = [r for r in rounds if r["type"] == "round" and "dp_audit" in r]
    assert len(audited) == 3  # every round: the latest models' audit


def test_canary_clients_audit_client_level_dp_in_any_study(tmp_path):
    privacy = Privacy(client_dp=ClientDP(noise_multiplier=1.0), audit=PrivacyAudit(canary_clients=200))
    out = run_study(config(privacy), tmp_path / "client")
    rows = (out / "tables" / "epsilon_audit.csv").read_text().splitlines()
    assert len(rows) == 2 and ",client_dp,pooled," in rows[1]
    last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if '"type": "round"' in line][-1]
    assert 0 <= last["client_dp_audit_epsilon_hat"] <= last["client_dp_epsilon"]
    assert last["client_dp_audit_m"] == 200 and last["client_dp_audit_estimate"] > 0


def test_the_section_keys_decide_which_audits_run():
    assert PrivacyAudit().membership and PrivacyAudit(max_per_set=50, canaries=10).membership
    assert not PrivacyAudit(canaries=10).membership and not PrivacyAudit(canary_clients=5).membership
    with pytest.raises(ValueError, match="the fedhealth2 study has no membership audit"):
        config(Privacy(audit=PrivacyAudit(max_per_set=50)))
    # refused before any data are read, as every protection an algorithm cannot take
    with pytest.raises(PrivacyError, match="privacy.audit.canary_clients: canary clients join client-level DP"):
        check_methods(registry.study_for(config(Privacy(audit=PrivacyAudit(canary_clients=5)))))
