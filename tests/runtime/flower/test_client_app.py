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
