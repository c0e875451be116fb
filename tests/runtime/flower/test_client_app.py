"""The ClientApp (fedcare.runtime.flower.client_app): a site's client id comes from its node config,
never from Flower's node ids."""

from __future__ import annotations

import pytest

from fedcare.runtime.flower.client_app import client_id_from
from fedcare.runtime.sites import SiteError


CLIENTS = [1, 2, 3]  # partition-id i <-> client CLIENTS[i]


def test_client_id_comes_from_node_config_never_from_flower_node_ids():
    assert client_id_from({"site": "hospital-a", "partition-id": 0}, CLIENTS) == "hospital-a"
    assert client_id_from({"partition-id": 2, "num-partitions": 3}, CLIENTS) == 3
    assert client_id_from({"partition-id": 2}, None) == 2
    with pytest.raises(SiteError, match="site"):
        client_id_from({}, CLIENTS)
    with pytest.raises(SiteError, match="partition-id 3"):
        client_id_from({"partition-id": 3}, CLIENTS)


def test_a_sites_error_leaves_it_without_the_sites_paths(tmp_path):
    """The coordinator greets a site whose data directory is missing: the error Flower sends back
    (the exception's text) names the site and the problem but not the path on the site's disk,
    which the site's own log keeps (the exception's cause); fedcare 0.2 sent it, and the
    coordinator copied it into run.json."""
    from flwr.app import ConfigRecord, Context, Message, RecordDict

    from fedcare.config import to_toml
    from fedcare.deployment.app import client_app
    from fedcare.runtime.flower.link import HELLO

    from support.flower_offline import task_identity
    from support.pain import flower_config

    missing = tmp_path / "hospital-b" / "UNBC-McMaster"
    greeting = {"experiment": to_toml(flower_config(tmp_path, sites={"hospital-a": 43, "hospital-b": 80})),
                "name": "x.toml"}
    context = Context(run_id=1, node_id=7, node_config={"site": "hospital-b", "data-dir": str(missing)}, state=RecordDict(),
                      run_config={})
    with task_identity(node_id=7):
        message = Message(RecordDict({HELLO: ConfigRecord(greeting)}), dst_node_id=7, message_type="query")
        with pytest.raises(SiteError) as raised:
            client_app(message=message, context=context)
    assert str(raised.value) == "site 'hospital-b': data directory <a path at the site> does not exist"
    assert str(missing) in str(raised.value.__cause__)  # for the site's log
