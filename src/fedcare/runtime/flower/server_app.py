"""A ServerApp from Python factories (Flower 1.42, Message API): any algorithm's server half
over a fixed number of rounds, with the sites reached through `FlowerClients`. (A registered
study's experiment runs through `fedcare.deployment.app` instead.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from torch import nn

from fedcare.algorithms.base import Algorithm
from fedcare.runtime.federation import Federation
from fedcare.runtime.flower.link import FlowerClients, FlowerRunError, LinkSettings, SiteLink
from fedcare.runtime.refs import Split


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
    "global_message", "clients_metrics": {client: the client's `metrics` on its `Split("eval")` data}}.
    """
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
        if algorithm.server.has_setup:
            federation.run_setup("setup", {c: Split("train") for c in link.node_of})
        for rnd in range(1, rounds + 1):
            info = federation.run_round(phase, rnd, {c: Split("train") for c in link.node_of})
            evaluated = federation.evaluate({c: Split("eval") for c in link.node_of}, metrics)
            if on_metrics is not None:
                on_metrics({"round": rnd, **info, "global_message": federation.global_message.clone(),
                            "clients_metrics": evaluated})

    return app

