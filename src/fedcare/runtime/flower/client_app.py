"""The ClientApp a site runs (Flower 1.42, Message API): fedcare's client operations
(`fedcare.runtime.clients`) on the site's own data, through the same `ClientRunner` as the
in-process simulator.

`build_client_app(open_site)` serves whatever `open_site` opens from the greeting the server
sends (the config-driven app of `fedcare.deployment.app` opens a registered study's site);
`make_client_app` builds one from Python factories (any algorithm, model and data).

A site's ClientApp also answers a plain Flower strategy (`flwr.serverapp.strategy.FedAvg`
and friends): a TRAIN message with an "arrays" record is one round of the site's algorithm
from those arrays (share-everything algorithms such as FedAvg), replied as Flower expects.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from fedcare.algorithms.base import NUM_EXAMPLES, TRAIN_LOSS, Algorithm
from fedcare.algorithms.messages import Message as FedMessage
from fedcare.algorithms.training import ClientData, predict
from fedcare.compute import compute_facts
from fedcare.errors import UserError
from fedcare.runtime.clients import ClientRunner, Fit
from fedcare.runtime.flower.identity import SiteKeyError, sign_claim
from fedcare.runtime.flower.link import HELLO
from fedcare.runtime.flower.records import OPS, decode_ops, encode_results, record_to_tensors, tensors_to_record
from fedcare.runtime.flower.site import FactorySite, SiteError, SiteNode
from fedcare.runtime.flower.site_record import SiteRecord, record_file
from fedcare.runtime.preflight import DEFAULT_MIN_COUNT, site_summary
from fedcare.runtime.refs import DataRefError, Split
from fedcare.errors import UserError
from fedcare.runtime.sites import Builder, Site, without_paths

# node config keys: which site a SuperNode is, where its data and state live, and the key
# that proves it (the SuperNode's --auth-key: the greeting's challenge is signed with it)
SITE_KEY, DATA_DIR_KEY, STATE_DIR_KEY, AUTH_KEY_KEY = "site", "data-dir", "state-dir", "auth-key"
PARTITION_ID_KEY = "partition-id"  # set by Flower's Simulation Engine instead
MIN_COUNT_KEY = "preflight-min-count"  # node config: counts below it leave the site as "<k" (default 5)
GREETING = "fedcare-greeting"  # Context.state: what the site was greeted with
MAX_ERROR = 2000  # characters of a site's error that its failed greeting's answer carries

# (the greeting's content, the node's context) -> the site and the builder of its model and algorithms
SiteOpener = Callable[[Mapping[str, Any], Context], tuple[Site, Builder]]




RUN_KEY = "run"  # greeting: the fedcare run (kept across `fedcare flower run --resume`), named by a hex key


def _state_file(context: Context, site: Site) -> Path | None:
    """`<state-dir>/run-<key>/client-<id>.pt`: the key is the fedcare run's from the greeting (the
    same for a resumed run, which is a new Flower run), else Flower's run id."""
    state_dir = context.node_config.get(STATE_DIR_KEY) or context.run_config.get(STATE_DIR_KEY)
    if not state_dir:
        return None
    run = context.run_id
    if GREETING in context.state.config_records:
        key = json.loads(str(context.state.config_records[GREETING]["json"])).get(RUN_KEY)
        if key is not None:
            if not re.fullmatch(r"[0-9a-f]{8,64}", str(key)):  # it names a folder on the site's disk
                raise SiteError(f"the greeting's run key {str(key)[:80]!r} is not a hex key")
            run = key
    return Path(str(state_dir)) / f"run-{run}" / f"client-{site.client}.pt"


def _kept_file(state_file: Path | None) -> Path | None:
    """Where a site keeps its state as of the coordinator's last checkpoint (`SiteNode._keep`)."""
    return None if state_file is None else state_file.with_suffix(".kept.pt")


def keeps_paths_at_the_site(handler: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
    """`handler`, whose error leaves the site (Flower sends its text to the coordinator) without
    the site's paths; the site's own log (Flower logs the error with its cause) keeps them."""
    @functools.wraps(handler)
    def call(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except Exception as e:
            text = without_paths(str(e))
            if text == str(e):
                raise
            if isinstance(e, UserError):
                raise SiteError(text) from e
            raise RuntimeError(f"{type(e).__name__}: {text}") from e
    return call


def build_client_app(open_site: SiteOpener) -> ClientApp:
    """A ClientApp running fedcare's client operations at the site `open_site` opens."""
    app = ClientApp()
    nodes: dict[tuple[int, int], SiteNode] = {}  # (run, node) -> the site's client, while this process lives

    def open_node(opened: tuple[Site, Builder], context: Context) -> SiteNode:
        """The site's client, resumed from `Context.state`, else (a restarted SuperNode) from its state file."""
        site, builder = opened
        state_file = _state_file(context, site)
        record = SiteRecord(record_file(state_file), _site_name(context, site), site.client) if state_file else None
        node = SiteNode(site, builder, _kept_file(state_file), record, state_file)
        if not node.restore_from(context.state):
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
    @keeps_paths_at_the_site
    def hello(msg: Message, context: Context) -> Message:
        greeting = dict(msg.content.config_records[HELLO])
        try:
            answer = introduce(greeting, context)
        except UserError as e:  # this site cannot take part (its data, its settings): it says so, as itself
            if SITE_KEY not in context.node_config:
                raise  # a simulated node has no name of its own to fail under
            answer = {"site": str(context.node_config[SITE_KEY]), "error": _own_words(str(e), context)[:MAX_ERROR]}
        key_file = context.node_config.get(AUTH_KEY_KEY)
        if key_file and "challenge" in greeting:  # prove to the coordinator that this node is the site
            try:
                answer["signature"] = sign_claim(Path(str(key_file)), str(greeting["challenge"]), answer["site"],
                                                 answer.get("client"), answer.get("error"))
            except SiteKeyError as e:
                raise SiteError(f"site {answer['site']!r}: {e}") from None
        return Message(RecordDict({HELLO: ConfigRecord({"json": json.dumps(answer)})}), reply_to=msg)

    def introduce(greeting: dict, context: Context) -> dict:
        """The greeting's answer: which site and client this node is, and the facts the coordinator needs."""
        opened = open_site(greeting, context)  # fails here, naming the problem, before any training
        context.state[GREETING] = ConfigRecord({"json": json.dumps(greeting)})
        site = open_node(opened, context).site
        return {"client": site.client, "site": _site_name(context, site), "summary": site.summary(),
                "synthetic": bool(site.synthetic),
                "preflight": site_summary(site, _min_count(context)),  # aggregates only, small counts suppressed
                # threads as the experiment set them; the device and precision this site computes in
                "compute": {**compute_facts(), **(opened[1].compute.facts() if hasattr(opened[1], "compute") else {})}}

    @app.train()
    @keeps_paths_at_the_site
    def train(msg: Message, context: Context) -> Message:
        if OPS not in msg.content.config_records:
            return _strategy_fit(msg, context, node_for)
        node = node_for(context)
        try:
            ops = decode_ops(msg.content, node.site.data_refs)
        except DataRefError as e:  # the coordinator named data this site does not have
            raise SiteError(f"client {node.site.client!r}: {e}") from None
        results = node.handle(ops)
        node.store(context.state)
        state_file = _state_file(context, node.site)
        if state_file is not None:
            node.save_after_message(state_file)  # Context.state lives only in the SuperNode's memory
        return Message(encode_results(results), reply_to=msg)

    @app.evaluate()
    @keeps_paths_at_the_site
    def evaluate(msg: Message, context: Context) -> Message:
        """A plain Flower strategy's evaluation: the received arrays on the site's "eval" data."""
        node = node_for(context)
        tensors = record_to_tensors(msg.content.array_records["arrays"])
        client = node.builder.algorithm("fedavg").client
        model = client.load(node.model, FedMessage(tensors), {})
        data = node.site.data(Split("eval"))
        _, loss = predict(model, data, client.settings.task)
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": len(data), "eval_loss": loss})}),
                       reply_to=msg)

    return app


def _own_words(error: str, context: Context) -> str:
    """A site's error as it leaves the site: its folders named by their option, any other path
    as "<a path at the site>" (where a site keeps its data is the site's business)."""
    for key in (DATA_DIR_KEY, STATE_DIR_KEY, AUTH_KEY_KEY):
        folder = context.node_config.get(key)
        if folder:
            error = error.replace(str(Path(str(folder)).resolve()), f"<{key}>").replace(str(folder), f"<{key}>")
    return without_paths(error)  # any other path too


def _min_count(context: Context) -> int:
    """The site's own suppression threshold (its SuperNode's choice, never the experiment's)."""
    value = context.node_config.get(MIN_COUNT_KEY, DEFAULT_MIN_COUNT)
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        raise SiteError(f"node config {MIN_COUNT_KEY}: {value!r} is not a whole number") from None


def _site_name(context: Context, site: Site) -> str:
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
    train = Split("train")
    reply = runner.run(Fit("train", rnd, FedMessage(tensors), train), node.model, site.data(train))
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

    def open_site(greeting: Mapping[str, Any], context: Context) -> tuple[Site, Builder]:
        if int(greeting.get("seed", seed)) != seed:
            raise SiteError(f"this site runs with seed {seed}, the server with {greeting['seed']}")
        cid = client_id_from(context.node_config, client_ids)
        site = FactorySite(cid, algorithm_factory, model_factory, data_provider, eval_data_provider or data_provider,
                           seed=seed)
        return site, site

    return build_client_app(open_site)


