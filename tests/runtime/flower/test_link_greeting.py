"""A greeting's answer is untrusted input (issue 35, items 1 and 7): a node registered with its
own key could answer anything, and before these checks its answer was parsed and indexed
before its signature was verified, so `{garbage` stopped every run. Now a malformed answer is
refused and recorded, the run goes on with the sites; a site's key proves its site only as the
client `[deployment.sites]` lists for it (a string client id crashed the preflight before)."""

import json

import pytest
from flwr.app import RecordDict

from fedcare.runtime.flower.certs import make_site_key
from fedcare.runtime.flower.link import LinkSettings, SiteLink
from fedcare.runtime.flower.runtime import FlowerRuntime
from fedcare.runtime.preflight import Expectations, check_sites

from support.flower_grid import SitesGrid, never, site, stranger
from support.flower_offline import task_identity

SITES = {"site-43": 43, "site-80": 80}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    for name in (*SITES, "stranger"):
        make_site_key(root, name)
    return root / "keys"


def site_keys(keys) -> dict[str, str]:
    return {name: (keys / f"{name}.pub").read_text() for name in (*SITES, "stranger")}


def link_for(grid, keys, **settings) -> SiteLink:
    return SiteLink(grid, {"experiment": "x"}, LinkSettings(**{"connect_timeout": 0.5, "round_timeout": 0.5, **settings}),
                    site_keys=site_keys(keys), sites=SITES)


def sites(keys) -> dict:
    return {101: site("site-43", 43, keys / "site-43"), 102: site("site-80", 80, keys / "site-80")}


VALID = {"client": 43, "site": "site-43", "summary": {}, "synthetic": True}
GARBAGE = {
    "not JSON": "{garbage",
    "a JSON list": "[1, 2]",
    "a JSON string": '"site-43"',
    "no client": json.dumps({k: v for k, v in VALID.items() if k != "client"}),
    "no site": json.dumps({k: v for k, v in VALID.items() if k != "site"}),
    "a site name that is a path": json.dumps({**VALID, "site": "../../etc"}),
    "a client that is a list": json.dumps({**VALID, "client": [43]}),
    "a summary that is a list": json.dumps({**VALID, "summary": []}),
    "a signature that is a number": json.dumps({**VALID, "signature": 7}),
    "an error that is a number": json.dumps({"site": "site-43", "error": 7}),
    "nesting deeper than Python's stack": "[" * 100_000,
    "longer than 1 MiB": json.dumps({**VALID, "summary": {"x": "y" * (1 << 20)}}),
}


@pytest.mark.parametrize("answer", GARBAGE.values(), ids=GARBAGE.keys())
def test_a_stranger_answering_garbage_is_refused_and_the_sites_run(keys, answer):
    with task_identity():
        grid = SitesGrid({**sites(keys), 666: stranger(answer)})
        link = link_for(grid, keys)
        link.connect()
        assert sorted(link.exchange({43: [], 80: []}, {"operation": "fit", "round": 1})) == [43, 80]
    assert link.node_of == {43: 101, 80: 102}
    # greeted once, never again, never sent an operation
    assert [m.metadata.message_type for m in grid.pushed if m.metadata.dst_node_id == 666] == ["query"]
    [refused] = link.refused
    assert (refused["node"], refused["site"]) == (666, "?")
    assert refused["reason"].startswith("sent a malformed greeting answer: ")
    assert len(refused["reason"]) < 1000  # nothing of a long answer is copied into the records
    assert f"Node 666 was refused: {refused['reason']}." in FlowerRuntime(link, algorithm=None).notes()


def test_an_answer_without_fedcare_s_record_is_refused(keys):
    from flwr.app import Message

    with task_identity():
        link = link_for(SitesGrid({**sites(keys), 666: lambda m: Message(RecordDict({}), reply_to=m)}), keys)
        link.connect()
    assert link.node_of == {43: 101, 80: 102}
    assert [r["reason"] for r in link.refused] == ["sent a malformed greeting answer: no fedcare answer in it"]


def test_a_stranger_claiming_a_listed_site_with_its_own_key_is_refused(keys):
    """Well-formed, but signed with the stranger's key: the real site keeps its client."""
    with task_identity():
        link = link_for(SitesGrid({**sites(keys), 666: site("site-43", 43, keys / "stranger")}), keys)
        link.connect()
    assert link.node_of == {43: 101, 80: 102}
    assert [(r["node"], r["site"]) for r in link.refused] == [(666, "site-43")]
    assert "does not match site-43.pub" in link.refused[0]["reason"]


def test_a_site_s_key_proves_only_the_client_the_experiment_lists_for_it(keys):
    """site-80 holds its own key and signs for site-43's client: it is refused, site-43 keeps
    client 43, and site-80 is missing from the run, the reason recorded."""
    with task_identity():
        link = link_for(SitesGrid({101: site("site-43", 43, keys / "site-43"),
                                   102: site("site-80", 43, keys / "site-80")}), keys)
        link.connect()
    assert link.node_of == {43: 101}
    reason = "it claims client 43, but [deployment.sites] lists site 'site-80' as client 80"
    assert [(r["node"], r["site"], r["reason"]) for r in link.refused] == [(102, "site-80", reason)]
    [missed] = link.missed
    assert (missed["site"], missed["client"], missed["operation"]) == ("site-80", 80, "start")
    assert missed["reason"] == f"refused: {reason}"


def test_a_string_client_id_is_refused_and_the_preflight_checks_the_others(keys):
    """Client "80" is not client 80: refused by name, and the preflight (which sorted the clients,
    ints and a string, and crashed) checks the sites that joined."""
    with task_identity():
        link = link_for(SitesGrid({101: site("site-43", 43, keys / "site-43"),
                                   102: site("site-80", "80", keys / "site-80")}), keys)
        link.connect()
    assert link.node_of == {43: 101}
    assert link.refused[0]["reason"] == "it claims client '80', but [deployment.sites] lists site 'site-80' as client 80"
    preflight = check_sites(link, Expectations(splits=("sessions",)))
    assert preflight.ok and list(preflight.sites) == ["site-43"]


def test_a_proven_site_that_the_experiment_does_not_list_is_refused(keys):
    with task_identity():
        link = link_for(SitesGrid({**sites(keys), 103: site("stranger", 7, keys / "stranger")}), keys)
        link.connect()
    assert link.node_of == {43: 101, 80: 102}
    assert link.refused[0]["reason"] == "not a site of this experiment ([deployment.sites] lists site-43, site-80)"


def test_without_site_keys_a_simulated_node_may_answer_under_its_client_id():
    """Flower's Simulation Engine names a node by its client id ("43"), whatever name
    [deployment.sites] gives the site; without keys that is taken, with the listed client only."""
    with task_identity():
        grid = SitesGrid({1: site("43", 43), 2: site("80", 43), 3: stranger("{garbage")})
        link = SiteLink(grid, {}, LinkSettings(connect_timeout=0.5), sites=SITES)
        link.connect([43])
    assert link.node_of == {43: 1} and link.site_of == {43: "43"}
    assert [r["node"] for r in link.refused] == [2, 3]


@pytest.mark.timeout(60)
def test_a_node_that_never_answers_its_greeting_holds_up_no_start(keys):
    """connect_timeout is 10 minutes: once every listed site has answered, the start goes on;
    the silent node is not greeted again while it stays connected."""
    with task_identity():
        grid = SitesGrid({**sites(keys), 666: never})
        link = link_for(grid, keys, connect_timeout=600)
        link.connect()
        link.greet_new_nodes()
    assert link.node_of == {43: 101, 80: 102} and link.refused == []
    assert [m.metadata.dst_node_id for m in grid.pushed].count(666) == 1
