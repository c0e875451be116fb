"""The lineage a federation leaves (`fedcare.runtime.lineage`): one record per aggregation,
written when its unit is committed, each naming the global message it started from and the
one it made, the clients in it with their examples and updates, those left out and why, and
the federation's global model saved with its digest."""

import torch

from fedcare.algorithms import fedavg
from fedcare.algorithms.base import NUM_EXAMPLES
from fedcare.algorithms.messages import Message
from fedcare.algorithms.training import TrainSettings
from fedcare.config import Privacy, SecureAggregation
from fedcare.privacy import private_algorithm
from fedcare.runfiles import read_lineage
from fedcare.runtime.digest import code_digest, message_digest
from fedcare.runtime.federation import Federation
from fedcare.runtime.hashchain import check_chain
from fedcare.runtime.lineage import Aggregation, Lineage, model_name
from fedcare.runtime.lineage_verify import load_model, verify_lineage

from support.tiny import tiny_data, tiny_model

SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)
TRAIN = {1: tiny_data(1), 2: tiny_data(2), 3: tiny_data(3, n=24)}
CONFIG = "c" * 64


def _followed(tmp_path, algorithm=None, **lineage):
    record = Lineage(tmp_path, config_sha256=CONFIG, **lineage)
    federation = Federation(tiny_model(), algorithm or fedavg(SETTINGS), 7)
    record.follow(federation, "fedavg", {"method": "FedAvg", "seed": 7})
    return record, federation


def test_each_aggregation_is_recorded_when_its_unit_is_committed(tmp_path):
    lineage, federation = _followed(tmp_path)
    models = [message_digest(federation.global_message)]
    for rnd in (1, 2):
        federation.run_round("train", rnd, TRAIN)
        models.append(message_digest(federation.global_message))
    assert read_lineage(tmp_path) == []  # nothing before the unit is done
    size = lineage.commit((7, "FedAvg", 2))
    assert size == (tmp_path / "lineage.jsonl").stat().st_size
    first, second, model = check_chain(tmp_path / "lineage.jsonl")
    assert [first["type"], second["type"], model["type"]] == ["aggregate", "aggregate", "model"]
    assert (first["parent"], first["digest"], second["parent"], second["digest"]) == tuple(
        models[i] for i in (0, 1, 1, 2))
    assert first["clients"].keys() == {"1", "2", "3"}
    assert {c: v["examples"] for c, v in first["clients"].items()} == {"1": 40, "2": 40, "3": 24}
    updates = [v["update"] for r in (first, second) for v in r["clients"].values()]
    assert len(set(updates)) == 6 and all(len(u) == 64 for u in updates)
    assert first["dropped"] == {} and first["received"] == {} and first["after"] == {}
    assert first["unit"] == [7, "FedAvg", 2] and (first["phase"], first["round"], second["round"]) == ("train", 1, 2)
    assert first["label"] == {"method": "FedAvg", "seed": 7} and first["chain"] == model["chain"]
    assert (first["config_sha256"], first["code_sha256"], first["rule"]) == (CONFIG, code_digest(), None)
    # the federation's global model, saved: the file holds it, tensor for tensor
    assert model["digest"] == models[2] and model["file"].startswith("models/FedAvg_seed7-")
    saved = load_model(tmp_path / model["file"])
    assert message_digest(saved) == models[2]
    assert all(torch.equal(saved.tensors[k], v) for k, v in federation.global_message.tensors.items())


def test_early_stopping_goes_back_to_an_earlier_model_of_the_chain(tmp_path):
    lineage, federation = _followed(tmp_path)
    val = {c: tiny_data(10 + c) for c in TRAIN}
    result = federation.train_phase("session-1", TRAIN, val, max_rounds=5, patience=1)
    lineage.commit(("unit",))
    aggregates = [r for r in read_lineage(tmp_path) if r["type"] == "aggregate"]
    (model,) = [r for r in read_lineage(tmp_path) if r["type"] == "model"]
    assert len(aggregates) == result.rounds
    assert model["digest"] == aggregates[result.best_round - 1]["digest"]  # the best round's, restored
    assert verify_lineage(tmp_path).models == {model["file"]: model}


def test_under_secure_aggregation_the_record_holds_what_the_server_sees(tmp_path):
    secure = private_algorithm(fedavg(SETTINGS), Privacy(secure_aggregation=SecureAggregation()))
    lineage, federation = _followed(tmp_path, secure)
    federation.run_round("train", 1, TRAIN)
    lineage.commit(("u",))
    record = read_lineage(tmp_path)[0]
    assert record["clients"] == {"1": {}, "2": {}, "3": {}}  # who is in the sum; no update is visible
    assert record["secure_aggregation"]["examples"] == 104 and len(record["secure_aggregation"]["sum"]) == 64
    assert record["received"] == {}  # the model each client was sent, without the protocol's own entries


def test_clients_left_out_are_recorded_with_the_reason(tmp_path):
    lineage, federation = _followed(tmp_path, robustness={"rule": "median", "attackers": ["2", "9"]})
    federation.lineage.why_missing = lambda c: f"late (client {c})"
    m = federation.global_message
    reply = Message(dict(m.tensors), {NUM_EXAMPLES: 5.0})
    info = {"rejected": {"3": "a masked vector of length 4, not 9"}, "dp_epsilon_clients": {"1": 0.5, "2": 0.7},
            "client_dp_epsilon_clients": {"1": float("inf")}}
    federation.lineage.aggregated(Aggregation(
        "train", 1, m, message_digest(m), sent={c: m for c in (1, 2, 3, 4, 5)}, replies={1: reply, 2: reply},
        answered=[1, 2], secure=False, skipped=[5], over_budget=[6], info=info))
    lineage.commit(("u",))
    record = read_lineage(tmp_path)[0]
    assert record["dropped"] == {"3": "reply rejected: a masked vector of length 4, not 9", "4": "late (client 4)",
                                 "5": "DP-SGD budget spent: it replied without training",
                                 "6": "client-level DP budget: its next round would cross it, so it was not asked"}
    assert record["epsilon"] == {"dp_sgd": {"1": 0.5, "2": 0.7}, "client_dp": {"1": None}}  # unbounded: null
    assert record["rule"] == "median" and record["attackers"] == ["2"]  # client 9 is in no aggregate


def test_a_resume_cuts_the_lineage_back_to_the_checkpoint_and_continues_its_chain(tmp_path):
    lineage, federation = _followed(tmp_path)
    federation.run_round("train", 1, TRAIN)
    offset = lineage.commit(("u", 1))
    saved = federation.state_dict()  # the checkpoint after unit 1
    federation.run_round("train", 2, TRAIN)
    lineage.commit(("u", 2))  # written, then the process died before its checkpoint
    lineage.close()
    whole = (tmp_path / "lineage.jsonl").read_bytes()
    again = Lineage(tmp_path, config_sha256=CONFIG, truncate_to=offset)
    assert [r["unit"] for r in read_lineage(tmp_path)] == [["u", 1], ["u", 1]]
    resumed = Federation(tiny_model(), fedavg(SETTINGS), 7)
    again.follow(resumed, "fedavg", {"method": "FedAvg", "seed": 7})
    resumed.load_state_dict(saved)
    resumed.run_round("train", 2, TRAIN)
    again.commit(("u", 2))
    records = check_chain(tmp_path / "lineage.jsonl")
    assert [(r["type"], r["unit"]) for r in records] == [("aggregate", ["u", 1]), ("model", ["u", 1]),
                                                         ("aggregate", ["u", 2]), ("model", ["u", 2])]
    assert records[2]["parent"] == records[0]["digest"] and again.seal()["records"] == 4
    assert (tmp_path / "lineage.jsonl").read_bytes() == whole  # as the uninterrupted unit wrote it


def test_what_no_unit_committed_is_written_at_the_end_with_no_unit(tmp_path):
    lineage, federation = _followed(tmp_path)
    federation.run_round("train", 1, TRAIN)
    lineage.flush()
    assert [r["unit"] for r in read_lineage(tmp_path)] == [None, None]
    assert lineage.seal() == {"records": 2, "head": read_lineage(tmp_path)[-1]["hash"], "models": 1}


def test_model_file_names_are_readable_and_safe():
    assert model_name("fedavg", 5, {"method": "FP(N)", "seed": 5}) == "FP-N_seed5"
    assert model_name("fedavg", 1, {"method": "single-site", "seed": 1, "model": "HEI1"}) == \
        "single-site_model-HEI1_seed1"
    assert model_name("fedavg-dp", 2, {}) == "fedavg-dp_seed2"
    name = model_name("x", 1, {"method": "a/../b c", "model": "../../etc"})
    assert "/" not in name and " " not in name and not name.startswith(".")


def test_a_model_file_has_the_same_bytes_in_every_process():
    """Its metadata is one entry: safetensors writes a map of several in an order of its process's own."""
    import subprocess
    import sys

    script = ("import hashlib, torch; from fedcare.algorithms.messages import Message; "
              "from fedcare.runtime.lineage import model_bytes; "
              "m = Message({'b': torch.ones(3), 'a': torch.arange(4)}, {'y': 2.5, 'x': 1.0, 'num_examples': 3.0}); "
              "print(hashlib.sha256(model_bytes(m, '0' * 64)).hexdigest())")
    runs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
            for _ in range(6)}
    assert len(runs) == 1
