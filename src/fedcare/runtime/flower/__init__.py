"""fedcare on Flower 1.42 (Message API): a ServerApp running a federation's server side and a
ClientApp running its client operations at each site. Algorithm code never imports Flower;
this adapter imports the algorithms, and no study (`fedcare.deployment` binds studies to it)."""

from fedcare.runtime.flower.client_app import build_client_app, make_client_app
from fedcare.runtime.flower.runtime import FlowerRuntime
from fedcare.runtime.flower.server_app import make_server_app
from fedcare.runtime.flower.link import FlowerClients, FlowerRunError, LinkSettings, SiteLink
from fedcare.runtime.flower.records import decode_ops, decode_results, encode_ops, encode_results

__all__ = [
    "FlowerClients",
    "FlowerRunError",
    "FlowerRuntime",
    "LinkSettings",
    "SiteLink",
    "build_client_app",
    "decode_ops",
    "decode_results",
    "encode_ops",
    "encode_results",
    "make_client_app",
    "make_server_app",
]
