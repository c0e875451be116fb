"""The ClientApp (fedcare.runtime.flower.client_app): a site's client id comes from its node config,
never from Flower's node ids; a site that cannot take part answers its greeting with its error,
signed with its key, and a bug keeps its traceback."""

from __future__ import annotations

import json

import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fedcare.data.common import DataError
from fedcare.runtime.flower.certs import make_site_key
from fedcare.runtime.flower.client_app import build_client_app, client_id_from
from fedcare.runtime.flower.identity import claim_problem
from fedcare.runtime.flower.link import HELLO
from fedcare.runtime.sites import SiteError

from support.flower_grid import client_app_node
from support.flower_offline import task_identity


CLIENTS = [1, 2, 3]  # partition-id i <-> client CLIENTS[i]


def test_client_id_comes_from_node_config_never_from_flower_node_ids():
    assert client_id_from({"site": "hospital-a", "partition-id": 0}, CLIENTS) == "hospital-a"
    assert client_id_from({"partition-id": 2, "num-partitions": 3}, CLIENTS) == 3
    assert client_id_from({"partition-id": 2}, None) == 2
    with pytest.raises(SiteError, match="site"):
        client_id_from({}, CLIENTS)
    with pytest.raises(SiteError, match="partition-id 3"):
        client_id_from({"partition-id": 3}, CLIENTS)


# -- the greeting at the site: a site that cannot take part says so, as itself ------------------
def _greeted(app, node_config, challenge="c" * 64):
    """The site's answer to the coordinator's greeting (a QUERY carrying the experiment)."""
    with task_identity():
        greeting = Message(RecordDict({HELLO: ConfigRecord({"experiment": "x", "challenge": challenge})}),
                           dst_node_id=7, message_type=MessageType.QUERY)
        greeting.metadata.__dict__["_message_id"] = "m1"
        reply = client_app_node(app, 7, node_config)(greeting)
    return reply if reply.has_error() else json.loads(reply.content.config_records[HELLO]["json"])


def _failing_site(error):
    def open_site(greeting, context):
        raise error
    return build_client_app(open_site)


def test_a_site_that_cannot_take_part_answers_with_its_error_signed_with_its_key(tmp_path):
    make_site_key(tmp_path, "site-80")
    app = _failing_site(DataError(f"{tmp_path}/data: subject 80 not found: no {tmp_path}/data/Images/080-* folder"))
    node_config = {"site": "site-80", "auth-key": str(tmp_path / "keys" / "site-80"), "data-dir": str(tmp_path / "data")}
    answer = _greeted(app, node_config)
    # in the site's own words, its folders named by their option: where its data live is the site's business
    assert answer["site"] == "site-80"
    assert answer["error"] == "<data-dir>: subject 80 not found: no <data-dir>/Images/080-* folder"
    public = (tmp_path / "keys" / "site-80.pub").read_text()
    assert claim_problem(public, answer["signature"], "c" * 64, "site-80", None, answer["error"]) is None
    # the signature is of this failure: it proves no claim to a client, nor another error
    assert claim_problem(public, answer["signature"], "c" * 64, "site-80", 80) is not None
    assert claim_problem(public, answer["signature"], "c" * 64, "site-80", None, "another error") is not None


def test_a_bug_at_a_site_keeps_its_traceback_and_a_nameless_node_its_error():
    """Only a user's mistake (a UserError) becomes the site's answer; a simulated node (no site
    name of its own in its node config) fails as before, as does any bug."""
    reply = _greeted(_failing_site(ValueError("a bug")), {"site": "site-80"})
    assert reply.has_error() and "ValueError: a bug" in reply.error.reason
    reply = _greeted(_failing_site(SiteError("no data")), {"partition-id": 0})
    assert reply.has_error() and "SiteError: no data" in reply.error.reason


def test_a_sites_error_leaves_it_without_the_sites_paths(tmp_path):
    """The coordinator greets a site whose data directory is missing: the answer names the site
    and the problem, its folder by option, never the path on the site's disk (fedcare 0.2 sent
    it, and the coordinator copied it into run.json); an error from any other handler leaves
    without the site's paths too, and the site's own log keeps them (the exception's cause)."""
    from flwr.app import Context

    from fedcare.config import to_toml
    from fedcare.deployment.app import client_app
    from fedcare.runtime.flower.client_app import keeps_paths_at_the_site

    from support.pain import flower_config

    missing = tmp_path / "hospital-b" / "UNBC-McMaster"
    greeting = {"experiment": to_toml(flower_config(tmp_path, sites={"hospital-a": 43, "hospital-b": 80})),
                "name": "x.toml"}
    context = Context(run_id=1, node_id=7, node_config={"site": "hospital-b", "data-dir": str(missing)}, state=RecordDict(),
                      run_config={})
    with task_identity(node_id=7):
        message = Message(RecordDict({HELLO: ConfigRecord(greeting)}), dst_node_id=7, message_type="query")
        reply = client_app(message=message, context=context)
    answer = json.loads(reply.content.config_records[HELLO]["json"])
    assert answer["error"] == "site 'hospital-b': data directory <data-dir> does not exist"

    def fit(msg, context):
        raise DataError(f"{tmp_path}/cache/x.pt: damaged")

    def bug(msg, context):
        raise ValueError(f"cannot read {tmp_path}/state/s.pt")

    with pytest.raises(SiteError) as raised:
        keeps_paths_at_the_site(fit)(None, None)
    assert str(raised.value) == "<a path at the site>: damaged" and str(tmp_path) in str(raised.value.__cause__)
    with pytest.raises(RuntimeError) as raised:
        keeps_paths_at_the_site(bug)(None, None)
    assert str(raised.value) == "ValueError: cannot read <a path at the site>"
