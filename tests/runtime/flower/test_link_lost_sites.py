"""A listed site that does not take part is never lost without a word (issue 35, item 3; issue
37, "what a hospital engineer met", item 4): a site that cannot take part (another site's
data, labels out of range) says so in its signed answer, and is named as the site it was listed
as, not filed as a refused node claiming '?'; the start does not wait for it; a site that is not
running, failed, was late or gone is recorded with the reason, each exchange it missed with its
method, phase and round; and a run without every listed site is never called complete, also
when it was resumed without one."""

import pytest
from flwr.common.constant import ErrorCode
from support.tiny import tiny_model

from fedcare.algorithms.messages import Message
from fedcare.report.html import incomplete_text
from fedcare.runtime.flower.certs import make_site_key
from fedcare.runtime.flower.link import FlowerClients, FlowerRunError, LinkSettings, SiteLink
from fedcare.runtime.flower.runtime import FlowerRuntime
from fedcare.runtime.refs import Split

from support.flower_grid import SitesGrid, error_reply, never, site, stranger
from support.flower_offline import task_identity

SITES = {"site-43": 43, "site-80": 80, "site-92": 92}
WRONG_DATA = "site 'site-80': subject 80 not found in /data/UNBC (its Images/ holds subjects 43)"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    for name in SITES:
        make_site_key(root, name)
    return root / "keys"


def link_for(grid, keys, written=None, **settings) -> SiteLink:
    written = [] if written is None else written
    settings = {"connect_timeout": 0.5, "round_timeout": 0.3, "poll_interval": 0.01, **settings}
    return SiteLink(grid, {"experiment": "x"}, LinkSettings(**settings), on_missed=written.append,
                    on_participation=written.append,
                    site_keys={s: (keys / f"{s}.pub").read_text() for s in SITES}, sites=SITES)


def good(keys, name, **kwargs):
    return site(name, SITES[name], keys / name, **kwargs)


@pytest.mark.timeout(60)
def test_a_site_that_cannot_take_part_is_named_and_the_start_does_not_wait_for_it(keys):
    """connect_timeout is 10 minutes: the start goes on once every listed site has joined or
    failed, the failure named by the site, in its own words."""
    written = []
    with task_identity():
        grid = SitesGrid({101: good(keys, "site-43"), 102: good(keys, "site-80", error=WRONG_DATA),
                          103: good(keys, "site-92")})
        link = link_for(grid, keys, written, connect_timeout=600)
        link.connect()
    assert sorted(link.node_of) == [43, 92] and link.refused == []
    assert written == [{"type": "missed", "site": "site-80", "client": 80, "operation": "start",
                        "reason": f"its greeting failed: {WRONG_DATA}"}]
    facts = FlowerRuntime(link, algorithm=None).facts()
    assert facts["complete"] is False and facts["incomplete_sites"] == ["site-80"]
    notes = FlowerRuntime(link, algorithm=None).notes()
    assert f"Site 'site-80' was missing at the start: its greeting failed: {WRONG_DATA}." in notes
    assert incomplete_text({"status": "finished", **facts}).startswith("INCOMPLETE FEDERATION: site(s) site-80")


def test_a_failure_signed_with_another_key_is_a_stranger_s_and_refused(keys):
    """A stranger cannot make a listed site look failed: its failure must carry the site's signature."""
    with task_identity():
        grid = SitesGrid({101: good(keys, "site-43"), 102: good(keys, "site-80"), 103: good(keys, "site-92"),
                          666: site("site-80", None, keys / "site-43", error="I am site-80 and I give up")})
        link = link_for(grid, keys)
        link.connect()
    assert sorted(link.node_of) == [43, 80, 92] and link.missed == []
    assert [(r["node"], r["site"]) for r in link.refused] == [(666, "site-80")]


def test_a_listed_site_not_running_makes_the_run_incomplete_naming_it(keys):
    written = []
    with task_identity():
        grid = SitesGrid({101: good(keys, "site-43"), 102: good(keys, "site-80"), 666: stranger("{garbage")})
        link = link_for(grid, keys, written)
        link.connect()
        answered = link.exchange({43: [], 80: []}, {"operation": "fit", "phase": "train", "round": 1})
    assert sorted(answered) == [43, 80]
    [start] = [r for r in written if r["type"] == "missed"]
    assert (start["site"], start["reason"]) == ("site-92", "not running (no node answered the greeting as this site)")
    runtime = FlowerRuntime(link, algorithm=None)
    assert runtime.facts()["complete"] is False and runtime.facts()["incomplete_sites"] == ["site-92"]
    assert ("Site 'site-92' was missing at the start: not running (no node answered the greeting as this site)."
            in runtime.notes())
    assert any(n.startswith("Not a complete federation: 'site-92'") for n in runtime.notes())


def test_below_quorum_the_start_fails_naming_each_site_and_why(keys):
    with task_identity():
        grid = SitesGrid({101: good(keys, "site-43"), 102: good(keys, "site-80", error=WRONG_DATA)})
        link = link_for(grid, keys, min_sites=3)
        with pytest.raises(FlowerRunError, match=r"only 1 of 3 sites joined .* missing clients: \[80, 92\]; "
                                                 r"site 'site-80': its greeting failed: site 'site-80': subject 80"):
            link.connect()


def _clients(link: SiteLink) -> FlowerClients:
    return FlowerClients(link, "federation-1", "fedavg", 0, tiny_model(), label={"method": "fedavg", "seed": 0})


def _work(*clients) -> dict:
    return {c: (Message({}, {}), Split("train")) for c in clients}


def test_a_site_gone_mid_run_is_recorded_with_phase_and_round_for_every_exchange_it_missed(keys):
    """site-80 dies in round 2 (the SuperLink answers for it: node unavailable): its fit and the
    validation after it are recorded with method, phase and round, and the run is not complete."""
    gone = {"now": False}

    def dies(m):
        return error_reply(m, ErrorCode.NODE_UNAVAILABLE, "Error: Node Unavailable") if gone["now"] else \
            good(keys, "site-80")(m)

    written = []
    with task_identity():
        grid = SitesGrid({101: good(keys, "site-43"), 102: dies, 103: good(keys, "site-92")})
        clients = _clients(link := link_for(grid, keys, written))
        link.connect()
        clients.fit("train", 1, _work(43, 80, 92))
        clients.evaluate(_work(43, 80, 92), "loss")
        gone["now"] = True
        clients.fit("train", 2, _work(43, 80, 92))
        clients.evaluate(_work(43, 80, 92), "loss")
    missed = [r for r in written if r["type"] == "missed"]
    assert [(r["site"], r["operation"], r["phase"], r["round"], r["method"]) for r in missed] == [
        ("site-80", "fit", "train", 2, "fedavg"), ("site-80", "evaluate loss", "train", 2, "fedavg")]
    assert missed[0]["reason"] == "gone: Error: Node Unavailable"
    assert missed[1]["reason"].startswith("not connected: gone during fit (fedavg train round 2)")
    runtime = FlowerRuntime(link, algorithm=None)
    assert runtime.facts()["complete"] is False and runtime.facts()["incomplete_sites"] == ["site-80"]
    [note] = [n for n in runtime.notes() if n.startswith("Site 'site-80' did not answer")]
    assert note.startswith("Site 'site-80' did not answer: fedavg train round 2 (fit); fedavg train round 2 "
                           "(evaluate loss). Why: gone: Error: Node Unavailable; not connected: gone during")


def test_a_site_whose_message_expired_is_late_not_missing(keys):
    """The message's time-to-live is round_timeout: when it runs out first, the SuperLink answers
    "message unavailable". That is a late site (dropped under "drop"), not one that is gone."""
    def expires(m):
        return error_reply(m, ErrorCode.MESSAGE_UNAVAILABLE, "Error: Message Unavailable") if m.metadata.message_type \
            == "train" else good(keys, "site-92")(m)

    written = []
    with task_identity():
        grid = SitesGrid({101: good(keys, "site-43"), 102: good(keys, "site-80"), 103: expires})
        link = link_for(grid, keys, written)
        link.connect()
        link.exchange({43: [], 80: [], 92: []}, {"operation": "fit", "phase": "train", "round": 1})
        link.exchange({43: [], 80: [], 92: []}, {"operation": "fit", "phase": "train", "round": 2})
    rounds = [(r["round"], r["late"], r["missing"]) for r in written if r["type"] == "participation"]
    assert rounds == [(1, ["site-92"], []), (2, [], ["site-92"])]  # late, then dropped until it reconnects
    missed = [r for r in written if r["type"] == "missed"]
    assert missed[0]["late"] is True and missed[0]["reason"] == "late: no answer within round_timeout (0.3 s)"
    assert missed[1]["reason"] == "not connected: dropped after it was late for fit (train round 1)"


def test_a_late_site_that_never_answers_is_late_with_its_round(keys):
    written = []
    with task_identity():
        slow = good(keys, "site-92", work=never)
        link = link_for(SitesGrid({101: good(keys, "site-43"), 102: good(keys, "site-80"), 103: slow}), keys,
                        written, late_sites="skip-round")
        link.connect()
        link.exchange({43: [], 80: [], 92: []}, {"operation": "fit", "phase": "train", "round": 1})
    [missed] = [r for r in written if r["type"] == "missed"]
    assert (missed["site"], missed["phase"], missed["round"], missed["late"]) == ("site-92", "train", 1, True)
    assert [(r["late"], r["missing"]) for r in written if r["type"] == "participation"] == [(["site-92"], [])]


def test_a_run_resumed_without_one_of_its_sites_is_not_complete(keys):
    """As `fedcare flower run --resume` builds its link: the records before the checkpoint (every
    site answered), then the sites that connect now; site-92 does not come back."""
    with task_identity():
        link = link_for(SitesGrid({101: good(keys, "site-43"), 102: good(keys, "site-80")}), keys)
        link.participation = [{"type": "participation", "operation": "fit", "phase": "train", "round": 1,
                               "answered": ["site-43", "site-80", "site-92"], "late": [], "missing": []}]
        link.connect()
        link.exchange({43: [], 80: []}, {"operation": "fit", "phase": "train", "round": 2})
    facts = FlowerRuntime(link, algorithm=None).facts()
    assert facts["complete"] is False and facts["incomplete_sites"] == ["site-92"]
