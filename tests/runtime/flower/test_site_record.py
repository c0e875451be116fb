"""A site's own record (`fedcare.runtime.flower.site_record`): what the site computes of the
models it trained on and the updates it sent, and how it is held against the coordinator's
lineage: agreement, updates left out with the coordinator's reason, updates hidden in a secure
sum, and each kind of disagreement. (Whole runs: on Flower's Simulation Engine in
tests/studies/test_registry.py and test_run_privacy.py; deployed in
tests/deployment/test_cli_deployed_pain.py.)"""

import copy

import torch

from fedcare.algorithms import fedavg
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import TrainSettings
from fedcare.privacy.secagg import WIRE
from fedcare.runtime.clients import AfterAggregation, Fit
from fedcare.runtime.digest import code_digest, message_digest
from fedcare.runtime.federation import Federation
from fedcare.runtime.flower.records import Begin, Mark
from fedcare.runtime.flower.site import FactorySite, SiteNode
from fedcare.runtime.flower.site_record import PROTOCOL_PREFIX, SiteRecord, compare, model_part
from fedcare.runtime.hashchain import check_chain
from fedcare.runtime.lineage import Lineage
from fedcare.runtime.refs import Split

from support.tiny import tiny_data, tiny_model

SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def test_a_site_records_the_model_it_trained_on_and_the_update_it_sent(tmp_path):
    site = FactorySite(1, lambda: fedavg(SETTINGS), tiny_model, lambda c: tiny_data(c), lambda c: tiny_data(c))
    path = tmp_path / "client-1.record.jsonl"
    node = SiteNode(site, site, record=SiteRecord(path, "site-a", 1))
    model = tiny_model()
    sent = fedavg(SETTINGS).server.initial_message(model)
    begin = Begin("fedavg", 3, Message({k: v.clone() for k, v in model.state_dict().items()}))
    reply = node.handle([("ns", begin), ("ns", Mark(1, None)), ("ns", Fit("train", 1, sent, Split("train")))])[-1]
    node.handle([("ns", Mark(2, None)), ("ns", AfterAggregation("train", 1, reply, Split("train")))])
    fit, after = check_chain(path)
    assert {k: fit[k] for k in ("type", "site", "client", "namespace", "algorithm", "seed", "phase", "round")} == {
        "type": "fit", "site": "site-a", "client": "1", "namespace": "ns", "algorithm": "fedavg", "seed": 3,
        "phase": "train", "round": 1}
    assert (fit["received"], fit["sent"], fit["examples"]) == (message_digest(sent), message_digest(reply), 40)
    assert fit["code_sha256"] == after["code_sha256"] == code_digest()  # the fedcare code the site ran
    assert after["type"] == "after_aggregation" and after["received"] == message_digest(reply) and "sent" not in after


def test_secure_aggregations_own_entries_are_not_the_model():
    assert PROTOCOL_PREFIX == WIRE  # the same prefix as secure aggregation's (which this layer cannot import)
    model = Message({"w": torch.ones(2)}, {"num_examples": 3.0})
    on_the_wire = Message({**model.tensors, WIRE + "inbox": torch.zeros(4, dtype=torch.uint8)},
                          {**model.scalars, WIRE + "weighted": 1.0})
    assert message_digest(model_part(on_the_wire)) == message_digest(model)


def _lineage(tmp_path):
    """A lineage of three clients over two rounds, and the records of truthful sites: (records, entries)."""
    lineage = Lineage(tmp_path, config_sha256="c" * 64)
    federation = Federation(tiny_model(), fedavg(SETTINGS), 7)
    lineage.follow(federation, "fedavg", {"method": "fedavg", "seed": 7})
    for rnd in (1, 2):
        federation.run_round("train", rnd, {c: tiny_data(c, n=16) for c in (1, 2, 3)})
    lineage.commit(("u",))
    records = check_chain(tmp_path / "lineage.jsonl")
    entries = [{"type": "fit", "client": c, "algorithm": "fedavg", "phase": r["phase"], "round": r["round"],
                "received": r["received"].get(c, r["parent"]), "sent": v["update"]}
               for r in records if r["type"] == "aggregate" for c, v in r["clients"].items()]
    return records, entries


def test_a_truthful_sites_record_agrees_and_names_the_models_its_data_touched(tmp_path):
    records, entries = _lineage(tmp_path)
    result = compare(entries, records, 2)
    assert result.agrees and result.fits == 2 and len(result.used) == 2 and not result.left_out
    assert [m["file"] for m in result.models] == [r["file"] for r in records if r["type"] == "model"]
    assert len(result.aggregates) == 2


def test_every_kind_of_disagreement_is_named(tmp_path):
    records, entries = _lineage(tmp_path)
    mine = [dict(e) for e in entries if e["client"] == "2"]
    mine[0]["sent"] = "f" * 64  # the lineage holds another update from this site in round 1
    mine[1]["received"] = "e" * 64  # a model the coordinator never made
    result = compare(mine, records, 2)
    assert not result.agrees and len(result.problems) == 3
    problems = "\n".join(result.problems)
    assert "fit fedavg train round 1: the lineage's record 0 (unit u: fedavg train round 1) holds update" in problems
    assert "which sent ffffffffffff" in problems
    assert "fit fedavg train round 2: the site received model eeeeeeeeeeee, which the coordinator's lineage does " \
           "not list" in problems
    assert "the lineage's record 0 (unit u: fedavg train round 1) holds update" in problems
    assert problems.count("which it never sent") == 1  # round 1's, which the site did not send
    assert compare([], records, 3).problems[0].endswith("from this site, which it never sent")


def test_an_update_the_coordinator_left_out_is_said_with_its_reason(tmp_path):
    records, entries = _lineage(tmp_path)
    late = copy.deepcopy(records)
    first = late[0]
    first["dropped"]["3"] = "late: no reply within round_timeout (late_sites = 'drop')"
    del first["clients"]["3"]
    result = compare([e for e in entries if e["client"] == "3"], late, 3)
    assert result.agrees and len(result.used) == 1
    assert [why for _, why in result.left_out] == ["late: no reply within round_timeout (late_sites = 'drop')"]
    secure = copy.deepcopy(records)
    for r in secure:
        if r["type"] == "aggregate":
            r["clients"] = {c: {} for c in r["clients"]}
            r["secure_aggregation"] = {"examples": 48, "sum": "a" * 64}
    result = compare([e for e in entries if e["client"] == "1"], secure, 1)
    assert result.agrees and len(result.hidden) == 2 and not result.used
