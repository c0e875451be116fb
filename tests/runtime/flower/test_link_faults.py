"""Under `late_sites = "wait"` a fault changes no number (issue 37, the chaos test): a site
killed mid-fit (the SuperLink reports it gone) is waited for, its message sent again once it
rejoins, and the restarted site answers it from its state before that message; a reply the
federation drops as invalid is asked for again and the site answers it as the first time. The
rounds equal an undisturbed run's bit for bit; each fault is recorded (run.json's `rejoined`,
`asked_again`), and only a reply that stays invalid leaves the round without its site."""

from __future__ import annotations

import math

import pytest
import torch
from flwr.common.constant import ErrorCode

from fedcare.algorithms import feddyn
from fedcare.algorithms.messages import Message as FedMessage
from fedcare.algorithms.training import TrainSettings
from fedcare.runtime.clients import Fit
from fedcare.runtime.federation import Federation
from fedcare.runtime.flower import make_client_app
from fedcare.runtime.flower.link import ASK_AGAIN, FlowerClients, LinkSettings, SiteLink
from fedcare.runtime.flower.records import decode_ops, decode_results, encode_results
from fedcare.runtime.flower.runtime import FlowerRuntime
from fedcare.runtime.refs import Split

from support.flower_grid import SitesGrid, client_app_node, error_reply, is_greeting
from support.flower_offline import task_identity
from support.tiny import tiny_data, tiny_model

SEED, ROUNDS = 5, 3
SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)
CLIENTS = ["a", "b", "c"]
DATA = {"a": tiny_data(1), "b": tiny_data(2), "c": tiny_data(3, n=24)}


@pytest.fixture(autouse=True)
def _a_serverapp_run():
    with task_identity():  # what Flower sets in a ServerApp's process: messages need it
        yield


def _site(name: str, state: object, node_id: int):
    """Site `name` as a freshly started SuperNode runs fedcare's ClientApp (a new process: nothing in memory)."""
    app = make_client_app(lambda: feddyn(SETTINGS), tiny_model, DATA.__getitem__, SEED)
    return client_app_node(app, node_id, {"site": name, "state-dir": str(state)})


def _fit_round(m) -> int | None:
    if is_greeting(m):
        return None
    return next((op.round for _, op in decode_ops(m.content, [Split]) if isinstance(op, Fit)), None)


def _run(grid: SitesGrid, connect_timeout: float = 5) -> tuple[list[dict], dict, FlowerRuntime]:
    """ROUNDS rounds of FedDyn and an evaluation across the grid's sites, late_sites = "wait".
    FedDyn's clients keep a correction that every fit changes: a fit run twice from the state
    after it would not give the first reply."""
    link = SiteLink(grid, {}, LinkSettings(late_sites="wait", round_timeout=5, connect_timeout=connect_timeout,
                                           poll_interval=0.01))
    link.connect(CLIENTS)
    model = tiny_model()
    federation = Federation(model, feddyn(SETTINGS), SEED, clients=FlowerClients(link, "federation-1", "feddyn", SEED,
                                                                                 model))
    train = {c: Split("train") for c in CLIENTS}
    infos = [federation.run_round("train", rnd, train) for rnd in range(1, ROUNDS + 1)]
    infos.append(federation.evaluate(train, "binary"))
    return infos, federation.global_message.tensors, FlowerRuntime(link, algorithm=None)


def _undisturbed(tmp_path):
    return _run(SitesGrid({i + 1: _site(c, tmp_path / "calm" / c, i + 1) for i, c in enumerate(CLIENTS)}))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("killed", ["before it saved its state", "after it saved its state"])
def test_a_site_killed_mid_fit_is_waited_for_and_its_message_sent_again(tmp_path, killed):
    """Site c's SuperNode dies during round 2's fit (before or after the site wrote its state
    file: the reply is lost either way); the SuperLink reports it gone; it restarts as a new
    node with nothing in memory, rejoins, and answers round 2 from its state before it."""
    expected, expected_model, _ = _undisturbed(tmp_path)
    grid = SitesGrid({})
    state = tmp_path / "chaos" / "c"
    first = _site("c", state, 3)

    def dies_in_round_2(m):
        if _fit_round(m) != 2:
            return first(m)
        if killed == "after it saved its state":
            first(m)
        del grid.nodes[3]
        grid.nodes[13] = _site("c", state, 13)  # restarted: a new node id, a new process
        return error_reply(m, ErrorCode.NODE_UNAVAILABLE, "node 3 is offline")

    grid.nodes.update({1: _site("a", tmp_path / "chaos" / "a", 1), 2: _site("b", tmp_path / "chaos" / "b", 2),
                       3: dies_in_round_2})
    infos, model, runtime = _run(grid)
    assert infos == expected and _same(model, expected_model)  # bit for bit, and no site missed anything
    facts = runtime.facts()
    assert facts["complete"] is True and facts["missed"] == []
    assert [(r["site"], r["operation"], r["round"], r["reason"]) for r in facts["rejoined"]] == [
        ("c", "fit", 2, "gone: node 3 is offline")]
    assert [m.metadata.dst_node_id for m in grid.pushed if _fit_round(m) == 2] == [1, 2, 3, 13]  # sent again


def test_a_site_that_does_not_rejoin_within_connect_timeout_misses_the_exchange(tmp_path):
    grid = SitesGrid({})
    first = _site("c", tmp_path / "c", 3)

    def dies_for_good_in_round_2(m):
        if _fit_round(m) != 2:
            return first(m)
        del grid.nodes[3]
        return error_reply(m, ErrorCode.NODE_UNAVAILABLE, "node 3 is offline")

    grid.nodes.update({1: _site("a", tmp_path / "a", 1), 2: _site("b", tmp_path / "b", 2), 3: dies_for_good_in_round_2})
    infos, _, runtime = _run(grid, connect_timeout=1)
    assert [i.get("clients") for i in infos[:ROUNDS]] == [3, 2, 2]
    facts = runtime.facts()
    assert facts["complete"] is False and facts["rejoined"] == []
    assert (facts["missed"][0]["operation"], facts["missed"][0]["round"], facts["missed"][0]["reason"]) == (
        "fit", 2, "gone: node 3 is offline; it did not rejoin within connect_timeout (1 s)")


def _corrupted(node, rounds: dict[int, int]):
    """`node`, whose reply to the fit of each round in `rounds` holds a NaN, that many times."""
    def corrupting(m):
        reply = node(m)
        rnd = _fit_round(m)
        if rounds.get(rnd, 0) > 0:
            rounds[rnd] -= 1
            results = decode_results(reply.content)
            update = results[-1]
            tensors = {**update.tensors, "features.0.weight": update.tensors["features.0.weight"] * math.nan}
            reply.content = encode_results([*results[:-1], FedMessage(tensors, update.scalars)])
        return reply
    return corrupting


def test_a_reply_corrupted_once_is_dropped_asked_for_again_and_the_round_is_unchanged(tmp_path, caplog):
    expected, expected_model, _ = _undisturbed(tmp_path)
    sites = {i + 1: _site(c, tmp_path / "chaos" / c, i + 1) for i, c in enumerate(CLIENTS)}
    sites[2] = _corrupted(sites[2], {2: 1})
    infos, model, runtime = _run(SitesGrid(sites))
    assert infos == expected and _same(model, expected_model)
    assert "round 2 of phase 'train': dropped client 'b''s reply: tensor 'features.0.weight' holds NaN; " \
           "asking for it again" in caplog.text
    asked = runtime.facts()["asked_again"]
    assert [(r["site"], r["operation"], r["round"], r["reason"]) for r in asked] == [
        ("b", "fit", 2, "tensor 'features.0.weight' holds NaN")]
    assert runtime.facts()["complete"] is True


def test_a_reply_that_stays_invalid_is_dropped_from_its_round(tmp_path):
    """Asked ASK_AGAIN times, and invalid every time: the round goes on without the site, named."""
    sites = {i + 1: _site(c, tmp_path / c, i + 1) for i, c in enumerate(CLIENTS)}
    sites[2] = _corrupted(sites[2], {2: 1 + ASK_AGAIN})
    infos, _, runtime = _run(SitesGrid(sites))
    assert infos[1]["rejected"] == {"b": "tensor 'features.0.weight' holds NaN"} and infos[1]["clients"] == 2
    assert len(runtime.facts()["asked_again"]) == ASK_AGAIN
    assert "rejected" not in infos[0] and "rejected" not in infos[2]
