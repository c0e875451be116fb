"""What a run says about itself besides its numbers (`fedcare.studies.run_record`): a client's
reply dropped before aggregation is in the round's record, in run.log and on the terminal as it
happens, and in the report's notes (issue 35, item 2)."""

from __future__ import annotations

import json
import logging
import math

from fedcare.algorithms.base import ClientHalf
from fedcare.algorithms.fedap import FedAPClient
from fedcare.algorithms.messages import Message
from fedcare.studies import run_record
from fedcare.studies.run import run_study

from support.fedhealth2 import small_config


def test_a_dropped_reply_is_in_the_round_record_run_log_terminal_and_report(tmp_path, monkeypatch, capsys):
    fit, setup = ClientHalf.fit, FedAPClient.setup

    def nan_from_client_0_in_round_2(self, model, message, state, data, rng):
        reply, state = fit(self, model, message, state, data, rng)
        if rng.client == 0 and rng.round == 2:
            reply = Message({k: v * math.nan for k, v in reply.tensors.items()}, reply.scalars)
        return reply, state

    def negative_variance_from_client_1(self, model, message, state, data, rng):
        reply = setup(self, model, message, state, data, rng)
        if rng.client == 1:
            reply = Message({k: -v - 1 if k.endswith(".var") else v for k, v in reply.tensors.items()}, reply.scalars)
        return reply

    monkeypatch.setattr(ClientHalf, "fit", nan_from_client_0_in_round_2)
    monkeypatch.setattr(FedAPClient, "setup", negative_variance_from_client_1)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as on a terminal: no handler of the program's own
    config = small_config().model_copy(update={"methods": ["fedavg", "fedap"]})
    run = run_study(config, tmp_path / "run")

    rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["type"] == "round" and json.loads(line)["method"] in ("fedavg", "fedap")]
    nan, negative = "tensor 'features.0.weight' holds NaN", "statistic 'features.1.var' holds a negative variance"
    assert {(r["method"], r["round"], key): r[key] for r in rounds for key in ("rejected", "rejected_setup") if key in r} == {
        ("fedavg", 2, "rejected"): {"0": nan}, ("fedap", 1, "rejected_setup"): {"1": negative},
        ("fedap", 2, "rejected"): {"0": nan}}  # FedAP's client trains by ClientHalf.fit too
    assert [r["clients"] for r in rounds] == [4, 3, 4, 4, 3, 4]
    assert all(math.isfinite(r["train_loss"]) for r in rounds)  # the NaN never reached the aggregate

    log = (run / "run.log").read_text()
    assert f"fedavg (seed 1), round 2 of phase 'train': dropped client 0's reply: {nan}" in log
    assert f"fedap (seed 1), the setup exchange of phase 'setup': dropped client 1's reply: {negative}" in log
    assert f"warning: fedavg (seed 1), round 2 of phase 'train': dropped client 0's reply: {nan}" in capsys.readouterr().err

    notes = [n for n in json.loads((run / "run.json").read_text())["notes"] if "dropped before aggregation" in n]
    assert notes == [
        f"fedavg (seed 1): client 0's reply was dropped before aggregation ({nan}) in train round 2; the round went "
        "on without it.",
        f"fedap (seed 1): client 1's setup reply was dropped before aggregation ({negative}) in the setup exchange "
        "before train round 1; the setup went on without it.",
        f"fedap (seed 1): client 0's reply was dropped before aggregation ({nan}) in train round 2; the round went "
        "on without it."]
    assert "client 0&#x27;s reply was dropped before aggregation" in (run / "report.html").read_text()
    assert not run_record.RUNTIME_LOG.handlers  # the run's log is closed with the run
