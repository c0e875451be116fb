"""Flower 1.41 apps (Message API) that run fedcare's algorithm halves unchanged.

The ServerApp runs the same server side as the simulator (`Federation`, and a study's
protocol around it) with `FlowerClients`; the ClientApp runs the same `ClientRunner` on the
site's own data. Two ways to build them:

- from an experiment file (`server_app` / `client_app` in `fedcare.runtime.flower.app`, what
  `flwr run` and `fedcare flower run` use): the ServerApp takes the experiment as TOML text
  in the run config, greets every site with it, and runs the study;
- from Python factories (`make_server_app` / `make_client_app`): any algorithm and model, a
  fixed number of rounds.

A site's ClientApp also answers a plain Flower strategy (`flwr.serverapp.strategy.FedAvg`
and friends): a TRAIN message with an "arrays" record is one round of the site's algorithm
from those arrays (share-everything algorithms such as FedAvg), replied as Flower expects.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from torch import nn

from fedcare.algorithms.base import NUM_EXAMPLES, TRAIN_LOSS, Algorithm, ClientHalf
from fedcare.algorithms.messages import Message as FedMessage
from fedcare.algorithms.training import ClientData, predict
from fedcare.runtime.clients import ClientRunner, Fit
from fedcare.runtime.flower.link import HELLO, FlowerClients, FlowerRunError, LinkSettings, SiteLink
from fedcare.runtime.flower.records import (
    OPS,
    decode_ops,
    encode_results,
    record_to_tensors,
    tensors_to_record,
)
from fedcare.runtime.flower.site import FactorySite, SiteError, SiteNode, StudySite

# node config keys: which site a SuperNode is, where its data and state live
SITE_KEY, DATA_DIR_KEY, STATE_DIR_KEY = "site", "data-dir", "state-dir"
PARTITION_ID_KEY = "partition-id"  # set by Flower's Simulation Engine instead
GREETING = "fedcare-greeting"  # Context.state: what the site was greeted with

# (the greeting's content, the node's context) -> the site
SiteOpener = Callable[[Mapping[str, Any], Context], StudySite]


# ----------------------------------------------------------------------------- client side


def _state_file(context: Context, site: StudySite) -> Path | None:
    state_dir = context.node_config.get(STATE_DIR_KEY) or context.run_config.get(STATE_DIR_KEY)
    if not state_dir:
        return None
    return Path(str(state_dir)) / f"run-{context.run_id}" / f"client-{site.client}.pt"


def build_client_app(open_site: SiteOpener) -> ClientApp:
    """A ClientApp running fedcare's client operations at the site `open_site` opens."""
    app = ClientApp()
    nodes: dict[tuple[int, int], SiteNode] = {}  # (run, node) -> the site's client, while this process lives

    def open_node(site: StudySite, context: Context) -> SiteNode:
        """The site's client, resumed from `Context.state`, else (a restarted SuperNode) from its state file."""
        node = SiteNode(site)
        if not node.restore_from(context.state):
            state_file = _state_file(context, site)
            if state_file is not None:
                node.load(state_file)
        nodes[(context.run_id, context.node_id)] = node
        return node

    def node_for(context: Context) -> SiteNode:
        node = nodes.get((context.run_id, context.node_id))
        if node is None:
            greeting = {}  # a plain Flower strategy does not greet
            if GREETING in context.state.config_records:
                greeting = json.loads(str(context.state.config_records[GREETING]["json"]))
            node = open_node(open_site(greeting, context), context)
        return node

    @app.query()
    def hello(msg: Message, context: Context) -> Message:
        greeting = dict(msg.content.config_records[HELLO])
        site = open_site(greeting, context)  # fails here, naming the problem, before any training
        context.state[GREETING] = ConfigRecord({"json": json.dumps(greeting)})
        open_node(site, context)
        answer = {"client": site.client, "site": _site_name(context, site), "summary": site.summary(),
                  "synthetic": bool(site.synthetic)}
        return Message(RecordDict({HELLO: ConfigRecord({"json": json.dumps(answer)})}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        if OPS not in msg.content.config_records:
            return _strategy_fit(msg, context, node_for)
        node = node_for(context)
        results = node.handle(decode_ops(msg.content))
        node.store(context.state)
        state_file = _state_file(context, node.site)
        if state_file is not None:
            node.save(state_file)  # Context.state lives only in the SuperNode's memory
        return Message(encode_results(results), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        """A plain Flower strategy's evaluation: the received arrays on the site's "eval" data."""
        node = node_for(context)
        tensors = record_to_tensors(msg.content.array_records["arrays"])
        model = node.site.algorithm("fedavg").client.load(node.model, FedMessage(tensors), {})
        data = node.site.data("eval")
        _, loss = predict(model, data)
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": len(data), "eval_loss": loss})}),
                       reply_to=msg)

    return app


def _site_name(context: Context, site: StudySite) -> str:
    return str(context.node_config.get(SITE_KEY, site.client))


def _strategy_fit(msg: Message, context: Context, node_for) -> Message:
    """One round for a plain Flower strategy (FedAvg's message format), with the site's
    algorithm and its derived randomness for (seed, "train", client, server round)."""
    node = node_for(context)
    site = node.site
    if not isinstance(site, FactorySite):
        raise SiteError("a plain Flower strategy can drive a ClientApp built with make_client_app only")
    algorithm = site.algorithm("fedavg")
    config = msg.content.config_records.get("config", ConfigRecord())
    rnd = int(config.get("server-round", 1))
    seed = site.seed
    tensors = record_to_tensors(msg.content.array_records["arrays"])
    runner = ClientRunner(algorithm.client, seed, site.client, algorithm.client.init_state(node.model))
    reply = runner.run(Fit("train", rnd, FedMessage(tensors), "train"), node.model, site.data("train"))
    metrics = {"num-examples": int(reply.scalars[NUM_EXAMPLES]), TRAIN_LOSS: reply.scalars[TRAIN_LOSS]}
    return Message(RecordDict({"arrays": tensors_to_record(reply.tensors), "metrics": MetricRecord(metrics)}),
                   reply_to=msg)


def client_id_from(node_config: Mapping[str, Any], client_ids: Sequence[Any] | None) -> Any:
    """The client of a factory-built site: `site` from the node config if given, else Flower's
    `partition-id` mapped through `client_ids` (or the partition id itself)."""
    if SITE_KEY in node_config:
        return node_config[SITE_KEY]
    if PARTITION_ID_KEY not in node_config:
        raise SiteError(f"node config names no site: set {SITE_KEY!r} (e.g. --node-config '{SITE_KEY}=\"1\"')")
    pid = int(node_config[PARTITION_ID_KEY])
    if client_ids is None:
        return pid
    if not 0 <= pid < len(client_ids):
        raise SiteError(f"partition-id {pid} has no client: client_ids holds {len(client_ids)}")
    return client_ids[pid]


def make_client_app(
    algorithm_factory: Callable[[], Algorithm],
    model_factory: Callable[[], nn.Module],
    data_provider: Callable[[Any], ClientData],
    seed: int,
    *,
    client_ids: Sequence[Any] | None = None,
    eval_data_provider: Callable[[Any], ClientData] | None = None,
) -> ClientApp:
    """A ClientApp running `algorithm_factory().client` on `data_provider(client)` ("train")
    and `eval_data_provider(client)` ("eval", default the training data)."""

    def open_site(greeting: Mapping[str, Any], context: Context) -> StudySite:
        if int(greeting.get("seed", seed)) != seed:
            raise SiteError(f"this site runs with seed {seed}, the server with {greeting['seed']}")
        cid = client_id_from(context.node_config, client_ids)
        return FactorySite(cid, algorithm_factory, model_factory, data_provider, eval_data_provider or data_provider,
                           seed=seed)

    return build_client_app(open_site)


# ----------------------------------------------------------------------------- server side


def make_server_app(
    algorithm_factory: Callable[[], Algorithm],
    model_factory: Callable[[], nn.Module],
    rounds: int,
    seed: int,
    clients: Sequence[Any],
    on_metrics: Callable[[dict], None] | None = None,
    *,
    phase: str = "train",
    metrics: str = "loss",
    settings: LinkSettings = LinkSettings(),
) -> ServerApp:
    """A ServerApp running `algorithm_factory().server` for `rounds` rounds over `clients`,
    after the algorithm's one-off setup exchange (phase "setup") if it has one (FedAP, FedDG).

    After every round `on_metrics` receives {"round", "train_loss", "n_train", "clients",
    "global_message", "clients_metrics": {client: the client's `metrics` on its "eval" data}}.
    """
    from fedcare.runtime.simulation import Federation

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        algorithm = algorithm_factory()
        if algorithm.pooled:
            raise FlowerRunError(f"{algorithm.name}: a pooled (centralized) algorithm cannot run across sites")
        link = SiteLink(grid, {"seed": seed}, settings)
        link.connect(list(clients))
        model = model_factory()
        federation = Federation(model, algorithm, seed, clients=FlowerClients(link, "factory", algorithm.name, seed, model))
        if type(algorithm.client).setup is not ClientHalf.setup:
            federation.run_setup("setup", {c: "train" for c in link.node_of})
        for rnd in range(1, rounds + 1):
            info = federation.run_round(phase, rnd, {c: "train" for c in link.node_of})
            evaluated = federation.evaluate({c: "eval" for c in link.node_of}, metrics)
            if on_metrics is not None:
                on_metrics({"round": rnd, **info, "global_message": federation.global_message.clone(),
                            "clients_metrics": evaluated})

    return app


__all__ = ["FlowerRunError", "build_client_app", "client_id_from", "make_client_app", "make_server_app"]
