"""Deadlines and quorum on the ServerApp's side (`SiteLink.exchange`), with a fake Grid whose
sites answer after a chosen delay: a site late for round_timeout is dropped, skipped for the
round or waited for, as `[deployment] late_sites` says; every round's participation record
names who answered, was late, was missing; too few answers stop the run below quorum."""

import json
import time
from types import SimpleNamespace

import pytest

from fedcare.config import Deployment
from fedcare.report.html import incomplete_text
from fedcare.runtime.flower.link import HELLO, FlowerRunError, LinkSettings, SiteLink
from fedcare.runtime.flower.records import encode_results
from fedcare.runtime.flower.runtime import FlowerRuntime
from flwr.app import ConfigRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity


@pytest.fixture(autouse=True)
def _a_serverapp_run(monkeypatch):
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)  # what Flower sets in a ServerApp's process: messages need it
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


class SlowSitesGrid:
    """Nodes 1, 2, 3 are clients "a", "b", "c"; `delays[node]` lists, message by message, how
    many seconds the node takes to answer (0 once the list is used up)."""

    def __init__(self, delays: dict[int, list[float]]):
        self.delays = {node: list(d) for node, d in delays.items()}  # used up message by message
        self.clients = {1: "a", 2: "b", 3: "c"}
        self.pushed: dict[str, tuple[float, float, object]] = {}  # id -> (due time, node, message)

    def get_node_ids(self):
        return list(self.clients)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            node = m.metadata.dst_node_id
            delay = self.delays.get(node, []).pop(0) if self.delays.get(node) else 0.0
            ids.append(f"m{len(self.pushed)}")
            self.pushed[ids[-1]] = (time.monotonic() + delay, node, m)
        return ids

    def pull_messages(self, ids):
        replies = []
        for i in ids:
            due, node, m = self.pushed[i]
            if time.monotonic() < due:
                continue
            if HELLO in m.content.config_records:
                answer = {"client": self.clients[node], "site": f"site-{self.clients[node]}", "summary": {},
                          "synthetic": False}
                content = RecordDict({HELLO: ConfigRecord({"json": json.dumps(answer)})})
            else:
                content = encode_results([{"ok": node}])
            replies.append(SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i), content=content,
                                           has_error=lambda: False))
        return replies


def _link(policy: str, delays: dict[int, list[float]], min_sites: int = 1) -> tuple[SiteLink, list[dict]]:
    written: list[dict] = []
    settings = LinkSettings(min_sites=min_sites, round_timeout=0.3, connect_timeout=5, poll_interval=0.01,
                            late_sites=policy)
    link = SiteLink(SlowSitesGrid(delays), {}, settings, on_missed=written.append, on_participation=written.append)
    link.connect(["a", "b", "c"])
    return link, written


def _round(link: SiteLink, rnd: int) -> dict:
    return link.exchange({c: [] for c in ("a", "b", "c")}, {"operation": "fit", "round": rnd})


def _participation(written):
    return [(r["round"], r["answered"], r["late"], r["missing"]) for r in written if r["type"] == "participation"]


# site c is late for round 1 (its first message after the greeting), on time afterwards
LATE_ONCE = {3: [0.0, 1.0]}


def test_a_late_site_is_dropped_until_it_reconnects():
    link, written = _link("drop", LATE_ONCE)
    assert sorted(_round(link, 1)) == ["a", "b"]
    assert sorted(_round(link, 2)) == ["a", "b"]  # not asked again
    assert _participation(written) == [(1, ["site-a", "site-b"], ["site-c"], []),
                                       (2, ["site-a", "site-b"], [], ["site-c"])]
    assert [r for r in written if r["type"] == "missed"][0]["late"] is True
    facts = FlowerRuntime(link, algorithm=None).facts()
    assert facts["complete"] is False and facts["incomplete_sites"] == ["site-c"]
    assert facts["participation"]["site-c"] == {"answered": 0, "late": 1, "missing": 1}
    banner = incomplete_text({"status": "finished", **facts})
    assert banner.startswith("INCOMPLETE FEDERATION: site(s) site-c")  # never reported as a complete run


def test_a_late_site_skips_the_round_and_is_asked_again():
    link, written = _link("skip-round", LATE_ONCE)
    assert sorted(_round(link, 1)) == ["a", "b"]
    assert sorted(_round(link, 2)) == ["a", "b", "c"]
    assert _participation(written) == [(1, ["site-a", "site-b"], ["site-c"], []),
                                       (2, ["site-a", "site-b", "site-c"], [], [])]
    assert FlowerRuntime(link, algorithm=None).facts()["incomplete_sites"] == ["site-c"]


def test_a_late_site_is_waited_for():
    link, written = _link("wait", LATE_ONCE)
    t0 = time.monotonic()
    assert sorted(_round(link, 1)) == ["a", "b", "c"]
    assert time.monotonic() - t0 >= 0.9  # its answer came after round_timeout, and was taken
    assert _participation(written) == [(1, ["site-a", "site-b", "site-c"], ["site-c"], [])]
    facts = FlowerRuntime(link, algorithm=None).facts()
    assert facts["complete"] is True and facts["participation"]["site-c"] == {"answered": 1, "late": 1, "missing": 0}
    assert ("Participation of site 'site-c': answered in 1 of 1 rounds, late in 1 (late sites: wait: round 1), "
            "missing from 0.") in FlowerRuntime(link, algorithm=None).notes()


def test_a_round_below_quorum_stops_the_run_naming_the_late_site():
    link, written = _link("skip-round", LATE_ONCE, min_sites=3)
    with pytest.raises(FlowerRunError, match=r"below quorum: operation fit round 1: only 2 of 3 sites answered "
                                             r"\(min_sites = 3\); missing: \['site-c'\]"):
        _round(link, 1)
    assert _participation(written) == [(1, ["site-a", "site-b"], ["site-c"], [])]  # recorded before stopping


def _deployment(**fields) -> Deployment:
    return Deployment.model_validate(fields)


def test_min_sites_is_a_count_or_a_fraction_of_the_sites():
    assert _deployment(min_sites=2).quorum(5) == 2
    assert _deployment(min_sites=0.5).quorum(3) == 2  # rounded up
    assert _deployment(min_sites=0.6).quorum(5) == 3  # not 4 from 0.6 * 5 = 3.0000000000000004
    assert _deployment(min_sites=1.0).quorum(4) == 4
    assert _deployment().late_sites == "drop"  # today's behaviour unless the experiment says otherwise
    with pytest.raises(ValueError, match="at most 1"):
        _deployment(min_sites=1.5)
    with pytest.raises(ValueError, match="late_sites"):
        _deployment(late_sites="never")
