"""fedcare on Flower 1.41 (Message API): a ServerApp running an algorithm's server half and a
ClientApp running its client half. Algorithm code never imports Flower; this adapter imports
the algorithms."""

from fedcare.runtime.flower.apps import make_client_app, make_server_app
from fedcare.runtime.flower.records import (
    load_state,
    message_to_recorddict,
    recorddict_to_message,
    save_state,
)

__all__ = [
    "load_state",
    "make_client_app",
    "make_server_app",
    "message_to_recorddict",
    "recorddict_to_message",
    "save_state",
]
