"""A federation's server side: sampling, the server half, evaluation and early stopping. The
same loop runs the in-process simulator (with `LocalClients`) and Flower's ServerApp (with
`fedcare.runtime.flower.FlowerClients`). Clients are in `fedcare.runtime.clients`."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from torch import nn

from fedcare.algorithms.base import DP_EPSILON, DP_SKIPPED, NUM_EXAMPLES, PRIVACY_METRICS, TRAIN_LOSS, Algorithm, ClientId
from fedcare.algorithms.messages import ClientState, Message
from fedcare.runtime.clients import Clients, Data, LocalClients
from fedcare.runtime.digest import message_digest
from fedcare.runtime.lineage import Aggregation, Chain
from fedcare.seeding import numpy_rng

POOLED = "pooled"


@dataclass
class PhaseResult:
    rounds: int
    best_round: int
    best_val_loss: float
    history: list[dict] = field(default_factory=list)


class Federation:
    """The server side of a federation: sampling, the server half, snapshots for early
    stopping. Its clients (`clients`) run in this process by default (`LocalClients`), or at
    their sites on Flower (`fedcare.runtime.flower.FlowerClients`): the same code either way.

    `train`, `val` and `data` arguments map each client to its data: a reference its site
    resolves (`fedcare.runtime.refs.DataRef`), or the data itself for in-process clients."""

    def __init__(self, model: nn.Module, algorithm: Algorithm, seed: int, *, client_fraction: float = 1.0,
                 clients: Clients | None = None):
        if not 0 < client_fraction <= 1:
            raise ValueError(f"client_fraction must be in (0, 1], got {client_fraction}")
        self.model = model
        self.algorithm = algorithm
        self.seed = seed
        self.client_fraction = client_fraction
        self.server = algorithm.server  # its state (optimizer moments, FedAP weights) is snapshotted too
        self.server.bind_seed(seed)  # a server half that draws noise (client-level DP)
        self.global_message = self.server.initial_message(model)
        # called after every aggregation with (global message before, replies, global message after):
        # statistics of the updates the server sees (e.g. the surgical thesis's CosSim, GradDiff)
        self.observers: list[Callable[[Message, Mapping[ClientId, Message], Message], None]] = []
        self.clients: Clients = clients if clients is not None else LocalClients(model, algorithm.client, seed)
        self.lineage: Chain | None = None  # the run's lineage of this federation's aggregates (`Lineage.follow`)

    # -- in-process inspection (tests): what a client holds ------------------------------
    @property
    def states(self) -> dict[ClientId, ClientState]:
        return self.clients.states

    def state_of(self, client: ClientId) -> ClientState:
        return self.clients.runner(client).state

    def personal_model(self, client: ClientId) -> nn.Module:
        """The model this client would actually use: shared parts + its own private parts."""
        return self.algorithm.client.load(self.model, self.message_for(client), self.state_of(client))

    # -- the protocol ------------------------------------------------------------------
    def sample(self, phase: str, rnd: int, clients: list[ClientId]) -> list[ClientId]:
        """Clients for this round: all by default, else a fraction drawn from its own generator."""
        ordered = sorted(clients)
        if self.client_fraction >= 1:
            return ordered
        m = max(1, round(self.client_fraction * len(ordered)))
        picked = numpy_rng(self.seed, phase, rnd, "sampling").choice(len(ordered), size=m, replace=False)
        return [ordered[i] for i in sorted(picked)]

    def message_for(self, client: ClientId) -> Message:
        return self.server.message_for(client, self.global_message)

    def work(self, data: Mapping[ClientId, Data]) -> dict[ClientId, tuple[Message, Data]]:
        return {cid: (self.message_for(cid), data[cid]) for cid in sorted(data)}

    def run_setup(self, phase: str, data: Mapping[ClientId, Data]) -> None:
        """The algorithm's one-off setup exchange (a round 0), for the clients holding `data`."""
        replies = self.clients.setup(phase, self.work(data))
        answers = self.server.setup(replies) if replies else None
        if answers:
            self.clients.receive_setup(answers)

    def run_round(self, phase: str, rnd: int, train: Mapping[ClientId, Data]) -> dict:
        participants = self.sample(phase, rnd, list(train))
        # client-level DP with a budget: a client whose next round would cross it takes no part
        over_budget = self.server.over_budget(participants)
        participants = [c for c in participants if c not in over_budget]
        work = self.work({c: train[c] for c in participants})
        secure = self.algorithm.secure
        skipped: dict = {}
        if secure is None:
            replies = self.clients.fit(phase, rnd, work)
            # DP-SGD with a budget: a client with no step left replied without training
            skipped = {c: m for c, m in replies.items() if m.scalars.get(DP_SKIPPED)}
            replies = {c: m for c, m in replies.items() if c not in skipped}
            answered = sorted(replies)  # on Flower a site may have dropped out
        else:  # secure aggregation: the server gets one reply, the survivors' weighted mean
            if self.observers:
                raise RuntimeError("privacy.secure_aggregation: the server sees only the sum of the updates, but "
                                   "this federation's observers need each client's update")
            replies, answered = secure.fit(self.clients, phase, rnd, work, self.server.weighting)
            if all(m.scalars.get(NUM_EXAMPLES) == 0 for m in replies.values()):  # every client out of DP budget
                replies = {}
        previous = self.global_message
        parent = message_digest(previous) if self.lineage is not None else ""  # before: a server may update in place
        self.global_message = self.server.aggregate(self.global_message, replies)
        for observe in self.observers:
            observe(previous, replies, self.global_message)
        self.clients.after_aggregation(phase, rnd, self.work({c: train[c] for c in answered}))
        sizes = {c: m.scalars[NUM_EXAMPLES] for c, m in replies.items()}
        n = sum(sizes.values())
        loss = sum(replies[c].scalars[TRAIN_LOSS] * sizes[c] for c in sorted(replies)) / max(n, 1)
        info = {"train_loss": loss, "clients": len(answered), "n_train": int(n)}
        rejected = getattr(secure, "rejected", None)
        if rejected:  # secure aggregation dropped replies it could not sum: who, and why
            info["rejected"] = {str(c): why for c, why in sorted(rejected.items())}
        epsilons = [m.scalars[DP_EPSILON] for m in replies.values() if DP_EPSILON in m.scalars]
        if epsilons:  # DP-SGD: the largest epsilon any client has spent so far
            info[DP_EPSILON] = max(epsilons)
        if self.reports_privacy:  # DP-SGD: each client's epsilon over the whole run so far, fine-tuning included
            spent = self.privacy_spent({c: train[c] for c in participants})
            if any(DP_EPSILON in s for s in spent.values()):
                info[DP_EPSILON + "_clients"] = {str(c): s[DP_EPSILON] for c, s in sorted(spent.items())}
            if self.algorithm.auditor is not None:  # the one-run audit, from the same reports (canary scores)
                info.update(self.algorithm.auditor(self.seed, spent))
        if skipped or over_budget:  # out of privacy budget: these clients did not train this round
            info["skipped"] = sorted(str(c) for c in [*skipped, *over_budget])
        client_dp = self.server.spent_per_client()
        if client_dp is not None:  # client-level DP: each client's epsilon so far
            info["client_dp_epsilon_clients"] = client_dp
        for key, value in self.global_message.scalars.items():
            if key.startswith("client_dp_"):  # client-level DP: epsilon so far, the clipping norm
                info[key] = value
        if self.lineage is not None:
            self.lineage.aggregated(Aggregation(phase, rnd, previous, parent, {c: m for c, (m, _) in work.items()},
                                                replies, answered, secure is not None, sorted(skipped), over_budget,
                                                info))
        return info

    @property
    def reports_privacy(self) -> bool:
        """Whether the algorithm's client half reports on its privacy (a DP-SGD ledger, the one-run
        audit's canary scores; declared, through its wrappers)."""
        return self.algorithm.client.reports_privacy

    def privacy_spent(self, data: Mapping[ClientId, Data]) -> dict[ClientId, dict]:
        """Per client under DP-SGD: the epsilon it has spent over the whole run (every fit and
        fine-tuning), its steps and noise multiplier, asked of the client (it holds the ledger);
        with the one-run audit, its canaries' scores."""
        return self.clients.evaluate(self.work(data), PRIVACY_METRICS)

    def evaluate(self, data: Mapping[ClientId, Data], metrics: str) -> dict[ClientId, dict]:
        """Each client's personal model on its own data; the client computes `metrics` itself."""
        return self.clients.evaluate(self.work(data), metrics)

    def validation_loss(self, val: Mapping[ClientId, Data]) -> tuple[float, int]:
        """Example-weighted mean validation loss over the clients that hold validation data."""
        total, n = 0.0, 0
        for cid, m in sorted(self.evaluate(val, "loss").items()):
            if m["n"]:
                total += m["loss"] * m["n"]
                n += m["n"]
        return (total / n if n else float("nan")), n

    def snapshot(self) -> tuple:
        self.clients.snapshot()
        return self.global_message.clone(), copy.deepcopy(self.server)

    def restore(self, snap: tuple) -> None:
        message, server = snap
        self.global_message = message.clone()
        self.clients.restore()
        self.server = copy.deepcopy(server)

    # -- a resumable run's checkpoint (in process) ------------------------------------------
    def state_dict(self) -> dict:
        """What continuing this federation needs: the global message, the server half (its
        optimizer moments, FedAP's weights, ...) and, in process, every client's state."""
        if not hasattr(self.clients, "state_dict"):
            raise TypeError(f"{type(self.clients).__name__}: clients at their sites cannot be checkpointed here")
        return {"global_message": self.global_message.clone(), "server": copy.deepcopy(self.server),
                "clients": self.clients.state_dict()}

    def load_state_dict(self, saved: dict) -> None:
        self.global_message = saved["global_message"].clone()
        self.server = copy.deepcopy(saved["server"])
        self.clients.load_state_dict(saved["clients"])

    def train_phase(
        self,
        phase: str,
        train: Mapping[ClientId, Data],
        val: Mapping[ClientId, Data],
        *,
        max_rounds: int,
        patience: int,
        on_round: Callable[[dict], None] | None = None,
    ) -> PhaseResult:
        """Rounds until the weighted validation loss has not improved for `patience` rounds,
        then restore the best round's global message and every client's best private state.
        Centralized algorithms see one participant holding all the training data."""
        if self.algorithm.pooled:
            train = {POOLED: self.clients.pooled(train)} if train else {}
        result = PhaseResult(rounds=0, best_round=0, best_val_loss=math.inf)
        best = None
        for rnd in range(1, max_rounds + 1):
            info = self.run_round(phase, rnd, train)
            info["val_loss"], info["n_val"] = self.validation_loss(val)
            info["round"] = rnd
            result.rounds = rnd
            result.history.append(info)
            if on_round:
                on_round(info)
            if not math.isnan(info["val_loss"]) and info["val_loss"] < result.best_val_loss:
                result.best_val_loss, result.best_round = info["val_loss"], rnd
                best = self.snapshot()
            elif math.isnan(info["val_loss"]):
                best = self.snapshot()  # no validation data: keep the latest model
                result.best_round = rnd
            elif rnd - result.best_round >= patience:
                break
        if best is not None:
            self.restore(best)
        return result
