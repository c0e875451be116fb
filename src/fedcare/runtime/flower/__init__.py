"""fedcare on Flower 1.41 (Message API): a ServerApp running a federation's server side and a
ClientApp running its client operations at each site. Algorithm code never imports Flower;
this adapter imports the algorithms."""

from fedcare.runtime.flower.apps import build_client_app, make_client_app, make_server_app
from fedcare.runtime.flower.link import FlowerClients, FlowerRunError, LinkSettings, SiteLink
from fedcare.runtime.flower.records import (
    load_state,
    message_to_recorddict,
    recorddict_to_message,
    save_state,
)

__all__ = [
    "FlowerClients",
    "FlowerRunError",
    "LinkSettings",
    "SiteLink",
    "build_client_app",
    "load_state",
    "make_client_app",
    "make_server_app",
    "message_to_recorddict",
    "recorddict_to_message",
    "save_state",
]
