"""Flower 1.41 apps (Message API) that run a fedcare algorithm's two halves unchanged.

The ServerApp does, per round, exactly what `fedcare.runtime.simulation.Federation.run_round`
does, in the same order:

1. (once) a QUERY message to every node: each ClientApp answers with its fedcare client id,
   read from its node config (`client-id`) or mapped from Flower's `partition-id`. Flower's
   node ids are random, so they never enter a computation.
2. TRAIN to each node: `server.message_for(client, global)`; the ClientApp restores its
   `ClientState` from `Context.state`, runs `client.fit` with
   `Randomness(seed, phase, client, round)`, stores the new state and replies.
3. `server.aggregate` over the replies keyed by client id and inserted in sorted client-id
   order (`ServerHalf.aggregate` sorts too): arrival order never matters.
4. EVALUATE to each node with `server.message_for(client, new global)`: the ClientApp runs
   `client.after_aggregation` (PFDL's fine-tuning), stores the state, and evaluates the model
   it would actually use (shared + private parts) on its own data; it replies with metrics
   (and, if asked, its predictions).

Not yet: one-off setup exchanges (FedAP, FedDG; refused loudly at start), client sampling
(every connected node takes part, as `Federation` with client_fraction=1), config-file-driven
apps, dropouts/timeouts beyond failing loudly, state spilled to a state directory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flwr.app import (
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from torch import nn

from fedcare.algorithms.base import (
    NUM_EXAMPLES,
    TRAIN_LOSS,
    Algorithm,
    ClientHalf,
    ServerHalf,
)
from fedcare.algorithms.messages import Message as FedMessage
from fedcare.algorithms.training import ClientData, Randomness, predict
from fedcare.runtime.flower.records import (
    SCALARS,
    TENSORS,
    load_state,
    message_to_recorddict,
    record_to_tensors,
    recorddict_to_message,
    save_state,
    tensors_to_record,
)

CONFIG = "config"
METRICS = "metrics"
PREDICTIONS = "predictions"
CLIENT_ID_KEY = "client-id"  # node config key naming the fedcare client (site) of a SuperNode
PARTITION_ID_KEY = "partition-id"  # set by Flower's Simulation Engine
DEFAULT_PHASE = "train"

AlgorithmFactory = Callable[[], Algorithm]
ModelFactory = Callable[[], nn.Module]
DataProvider = Callable[[Any], ClientData]


class FlowerRunError(RuntimeError):
    """A node answered with an error, or the federation does not match what the run needs."""


# ----------------------------------------------------------------------------- client side


def client_id_from(node_config: Mapping[str, Any], client_ids: Sequence[Any] | None) -> Any:
    """The fedcare client id of this node: `client-id` from the node config if given, else
    Flower's `partition-id` mapped through `client_ids` (or the partition id itself)."""
    if CLIENT_ID_KEY in node_config:
        return node_config[CLIENT_ID_KEY]
    if PARTITION_ID_KEY not in node_config:
        raise FlowerRunError(f"node config names no client: set {CLIENT_ID_KEY!r} (e.g. --node-config '{CLIENT_ID_KEY}=1')")
    pid = int(node_config[PARTITION_ID_KEY])
    if client_ids is None:
        return pid
    if not 0 <= pid < len(client_ids):
        raise FlowerRunError(f"partition-id {pid} has no client: client_ids holds {len(client_ids)}")
    return client_ids[pid]


def make_client_app(
    algorithm_factory: AlgorithmFactory,
    model_factory: ModelFactory,
    data_provider: DataProvider,
    seed: int,
    *,
    client_ids: Sequence[Any] | None = None,
    eval_data_provider: DataProvider | None = None,
    return_predictions: bool = False,
) -> ClientApp:
    """A ClientApp running `algorithm_factory().client` on `data_provider(client_id)`.

    `model_factory` must build the same initial model every call (a client's first private
    state is `client.init_state(model_factory())`, as in `Federation`). Evaluation runs on
    `eval_data_provider(client_id)` (default: the training data). `return_predictions` sends
    the personal model's predictions back in the evaluate reply: a test aid, off by default
    since predictions are derived from a site's data.
    """
    app = ClientApp()
    evaluate_on = eval_data_provider or data_provider

    def prepare(msg: Message, context: Context):
        cid = client_id_from(context.node_config, client_ids)
        config = msg.content.config_records[CONFIG]
        if int(config["seed"]) != seed:
            raise FlowerRunError(f"client {cid!r} runs with seed {seed}, the server with {config['seed']}")
        algorithm = algorithm_factory()
        model = model_factory()
        state = load_state(context.state)
        if state is None:
            state = algorithm.client.init_state(model)
        rng = Randomness(seed, str(config["phase"]), cid, int(config["round"]))
        return cid, algorithm.client, model, state, rng

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        cid = client_id_from(context.node_config, client_ids)
        return Message(RecordDict({CONFIG: ConfigRecord({CLIENT_ID_KEY: cid})}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        cid, client, model, state, rng = prepare(msg, context)
        reply, new_state = client.fit(model, recorddict_to_message(msg.content), state, data_provider(cid), rng)
        save_state(context.state, new_state)
        return Message(message_to_recorddict(reply), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        cid, client, model, state, rng = prepare(msg, context)
        message = recorddict_to_message(msg.content)
        new_state = client.after_aggregation(model, message, state, data_provider(cid), rng)
        save_state(context.state, new_state)
        data = evaluate_on(cid)
        probabilities, loss = predict(client.load(model, message, new_state), data)
        content = RecordDict({METRICS: MetricRecord({"loss": float(loss), NUM_EXAMPLES: float(len(data))})})
        if return_predictions:
            content[PREDICTIONS] = tensors_to_record({PREDICTIONS: probabilities.detach()})
        return Message(content, reply_to=msg)

    return app


# ----------------------------------------------------------------------------- server side


def _check_replies(replies: Sequence[Message], expected: int, what: str) -> None:
    errors = [r.error for r in replies if r.has_error()]
    if errors:
        raise FlowerRunError(f"{what}: {len(errors)} node(s) failed: " + "; ".join(f"{e.code}: {e.reason}" for e in errors))
    if len(replies) != expected:
        raise FlowerRunError(f"{what}: {len(replies)} of {expected} nodes replied")


def _wait_for_nodes(grid: Grid, num_nodes: int | None, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if nodes and (num_nodes is None or len(nodes) >= num_nodes):
            return nodes
        if time.monotonic() > deadline:
            raise FlowerRunError(f"only {len(nodes)} node(s) connected after {timeout:.0f} s, need {num_nodes or 1}")
        time.sleep(0.5)


def make_server_app(
    algorithm_factory: AlgorithmFactory,
    model_factory: ModelFactory,
    rounds: int,
    seed: int,
    on_metrics: Callable[[dict], None] | None = None,
    *,
    phase: str = DEFAULT_PHASE,
    num_nodes: int | None = None,
    node_timeout: float = 120.0,
    reply_timeout: float | None = None,
) -> ServerApp:
    """A ServerApp running `algorithm_factory().server` for `rounds` rounds of `phase`.

    After every round `on_metrics` receives {"round", "train_loss", "n_train", "clients",
    "global_message", "clients_metrics": {client id: {"loss", "num_examples",
    ["predictions"]}}}; `global_message` is the fedcare `Message` after aggregation.
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        algorithm = algorithm_factory()
        server: ServerHalf = algorithm.server
        if type(algorithm.client).setup is not ClientHalf.setup or type(server).setup is not ServerHalf.setup:
            raise FlowerRunError(f"{algorithm.name}: setup exchanges are not supported on Flower yet")
        if algorithm.pooled:
            raise FlowerRunError(f"{algorithm.name}: a pooled (centralized) algorithm cannot run across sites")
        global_message = server.initial_message(model_factory())

        # which fedcare client sits behind which (random) Flower node id
        node_ids = _wait_for_nodes(grid, num_nodes, node_timeout)
        queries = [
            Message(RecordDict({CONFIG: ConfigRecord({"seed": seed})}), dst_node_id=n, message_type=MessageType.QUERY)
            for n in node_ids
        ]
        answers = list(grid.send_and_receive(queries, timeout=reply_timeout))
        _check_replies(answers, len(node_ids), "client-id query")
        node_of: dict[Any, int] = {}
        for a in answers:
            cid = a.content.config_records[CONFIG][CLIENT_ID_KEY]
            if cid in node_of:
                raise FlowerRunError(f"two nodes claim client id {cid!r}")
            node_of[cid] = a.metadata.src_node_id
        client_of = {n: c for c, n in node_of.items()}
        participants = sorted(node_of)

        def send(message_type: str, rnd: int, payload: Callable[[Any], FedMessage]) -> dict[Any, Message]:
            out = []
            for cid in participants:
                content = message_to_recorddict(payload(cid))
                content[CONFIG] = ConfigRecord({"seed": seed, "phase": phase, "round": rnd})
                out.append(Message(content, dst_node_id=node_of[cid], message_type=message_type))
            replies = list(grid.send_and_receive(out, timeout=reply_timeout))
            _check_replies(replies, len(out), f"round {rnd} {message_type}")
            by_client = {client_of[r.metadata.src_node_id]: r for r in replies}
            return {cid: by_client[cid] for cid in participants}  # sorted client-id order

        for rnd in range(1, rounds + 1):
            current = global_message
            fit_replies = send(MessageType.TRAIN, rnd, lambda cid, m=current: server.message_for(cid, m))
            replies = {cid: recorddict_to_message(r.content) for cid, r in fit_replies.items()}
            global_message = server.aggregate(global_message, replies)
            aggregated = global_message
            eval_replies = send(MessageType.EVALUATE, rnd, lambda cid, m=aggregated: server.message_for(cid, m))
            clients_metrics = {}
            for cid, r in eval_replies.items():
                metrics = {k: float(v) for k, v in r.content.metric_records[METRICS].items()}
                if PREDICTIONS in r.content.array_records:
                    metrics[PREDICTIONS] = record_to_tensors(r.content.array_records[PREDICTIONS])[PREDICTIONS]
                clients_metrics[cid] = metrics
            n = sum(replies[c].scalars[NUM_EXAMPLES] for c in participants)
            loss = sum(replies[c].scalars[TRAIN_LOSS] * replies[c].scalars[NUM_EXAMPLES] for c in participants) / max(n, 1)
            if on_metrics is not None:
                on_metrics(
                    {
                        "round": rnd,
                        "train_loss": loss,
                        "n_train": int(n),
                        "clients": len(participants),
                        "global_message": global_message.clone(),
                        "clients_metrics": clients_metrics,
                    }
                )

    return app


__all__ = [
    "CLIENT_ID_KEY",
    "SCALARS",
    "TENSORS",
    "FlowerRunError",
    "client_id_from",
    "make_client_app",
    "make_server_app",
]
