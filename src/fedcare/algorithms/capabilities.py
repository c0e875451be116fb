"""What an algorithm's halves need, read in one place.

The halves declare it (`fedcare.algorithms.base`), and the wrappers that delegate to another
half (`DelegatingServer`, `DelegatingClient`) pass the declarations on:

- `ServerHalf.needs`, what its `aggregate` reads of a round's replies: "mean" (their weighted
  mean is the new global message), "sum" (their weighted sum only, through a rule of its own:
  a server optimizer's step, SCAFFOLD's control variates) or "each" (each reply by itself:
  FedAP, FedDyn, q-FedAvg, a robust rule, client-level DP);
- `ServerHalf.has_setup`: a one-off exchange before training, each client's reply by itself;
- `ServerHalf.steps_from_inner`: a step from its inner server's aggregate alone (a server
  optimizer), so what replaces or noises a mean goes inside it;
- `ClientHalf.trains_in_loop`, `batched_fit`, `reports_privacy`: see `ClientHalf`.

The rules every consumer follows, from those declarations alone:

- **secure aggregation** hands the server one reply, the weighted mean of the round's
  replies: it accepts "mean" and "sum" servers and refuses "each" and a setup exchange;
- **a robust rule** replaces a mean, and **client-level DP** clips each update and noises
  their mean (its noise is calibrated to a mean of clipped updates): both need a "mean"
  server, found through the layers that step from it (a server optimizer then steps from the
  robust or noised mean; under DP that is post-processing, so the guarantee holds);
- **DP-SGD** needs every gradient step in the training loop (`trains_in_loop`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from fedcare.algorithms.base import Algorithm, ServerHalf


def the_mean(server: ServerHalf) -> ServerHalf:
    """The server half under `server`'s layers that step from their inner's aggregate (a
    server optimizer): the one whose rule is the round's aggregate, a mean or not."""
    while server.steps_from_inner:
        server = server.inner  # type: ignore[attr-defined]
    return server


def with_mean_replaced(server: ServerHalf, wrap: Callable[[ServerHalf], ServerHalf]) -> ServerHalf:
    """`server` with its mean (`the_mean`, a "mean" server) replaced by `wrap(mean)`: the layers
    above it are copied, so `server` itself is left as it was."""
    if not server.steps_from_inner:
        return wrap(server)
    outer = copy.copy(server)  # its state (an optimizer's moments) is its own from here on
    outer.inner = with_mean_replaced(server.inner, wrap)  # type: ignore[attr-defined]
    return outer


def own_rule(algorithm: Algorithm) -> str | None:
    """Why `algorithm`'s server has no mean a robust rule or client-level DP could take its
    place in (None: it has one)."""
    mean = the_mean(algorithm.server)
    if mean.needs == "mean":
        return None
    return (f"{algorithm.name} aggregates by its own rule ({type(mean).__name__}: FedAP's personal aggregates, "
            f"FedDyn's correction, q-FedAvg's loss weights), not by a mean")


def secure_aggregation_problem(algorithm: Algorithm) -> str | None:
    """Why secure aggregation, which hands the server only the round's weighted mean, cannot
    run `algorithm` (None: it can)."""
    server = algorithm.server
    if server.has_setup:
        return (f"its setup exchange ({type(the_mean(server)).__name__}.setup: FedAP's feature statistics, FedDG's "
                f"amplitude spectra) sends the server statistics of each client's data one by one")
    if server.needs == "each":
        return (f"its server ({type(the_mean(server)).__name__}) aggregates by its own rule from each client's reply "
                f"(FedAP's personal aggregates, q-FedAvg's per-client losses, FedDyn's correction), not from their sum")
    return None


def dp_sgd_problem(algorithm: Algorithm) -> str | None:
    """Why DP-SGD's per-example clipping cannot reach every training step of `algorithm`."""
    if algorithm.client.trains_in_loop:
        return None
    return f"{algorithm.name} takes gradient steps outside the training loop (its meta step)"


def declared(algorithm: Algorithm) -> dict[str, object]:
    """What `algorithm`'s halves declare, as one row (docs/algorithms.md's capability table)."""
    return {"algorithm": algorithm.name, "needs": algorithm.server.needs, "has_setup": algorithm.server.has_setup,
            "trains_in_loop": algorithm.client.trains_in_loop, "batched_fit": algorithm.client.batched_fit}
