"""A federation's server side: sampling, the server half, evaluation and early stopping. The
same loop runs the in-process simulator (with `LocalClients`) and Flower's ServerApp (with
`fedcare.runtime.flower.FlowerClients`). Clients are in `fedcare.runtime.clients`."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from fedcare.algorithms.base import DP_EPSILON, NUM_EXAMPLES, PRIVACY_METRICS, TRAIN_LOSS, Algorithm, ClientId
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.training import TrainingDiverged
from fedcare.errors import UserError
from fedcare.runtime.clients import Clients, Data, LocalClients
from fedcare.runtime.digest import message_digest
from fedcare.runtime.lineage import Aggregation, Chain
from fedcare.runtime.replies import (InvalidReplies, describe_rejected, disagreeing, fit_reply_problem, global_problem,
                                     setup_reply_problem, skipped_reply, split_replies)
from fedcare.seeding import numpy_rng

log = logging.getLogger("fedcare.runtime")

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
        self.setup_rejected: dict[ClientId, str] = {}  # the setup exchange's dropped replies, until a round records them

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
        work = self.work(data)
        problem = lambda c, m: setup_reply_problem(m, self.server.setup_reply_problem)  # noqa: E731
        replies, rejected = self._ask_again(f"the setup exchange of phase {phase!r}", work,
                                            *split_replies(self.clients.setup(phase, work), problem), problem)
        odd = disagreeing(replies)
        replies = {c: m for c, m in replies.items() if c not in odd}
        rejected = {**rejected, **odd}
        self._check_left(f"the setup exchange of phase {phase!r}", len(work), replies, rejected)
        self.setup_rejected.update(rejected)  # told in the next round's record
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
            skipped = {c: m for c, m in replies.items() if skipped_reply(m)}
            problem = lambda c, m: (fit_reply_problem(m, work[c][0], self.server.reply_problem)  # noqa: E731
                                    if c in work else "a reply to no question")
            replies, rejected = self._ask_again(
                f"round {rnd} of phase {phase!r}", work,
                *split_replies({c: m for c, m in replies.items() if c not in skipped}, problem), problem)
            self._check_left(f"round {rnd} of phase {phase!r}", len(work) - len(skipped), replies, rejected)
            answered = sorted(replies)  # on Flower a site may have dropped out; a rejected reply is a failed client's
        else:  # secure aggregation: the server gets one reply, the survivors' weighted mean
            if self.observers:
                raise RuntimeError("privacy.secure_aggregation: the server sees only the sum of the updates, but "
                                   "this federation's observers need each client's update")
            replies, answered = secure.fit(self.clients, phase, rnd, work, self.server.weighting)
            rejected = dict(secure.rejected)  # the masked replies it could not sum
            self._tell(f"round {rnd} of phase {phase!r}", rejected)
            if all(m.scalars.get(NUM_EXAMPLES) == 0 for m in replies.values()):  # every client out of DP budget
                replies = {}
        previous = self.global_message
        parent = message_digest(previous) if self.lineage is not None else ""  # before: a server may update in place
        self.global_message = self._aggregate(phase, rnd, replies, rejected)
        for observe in self.observers:
            observe(previous, replies, self.global_message)
        self.clients.after_aggregation(phase, rnd, self.work({c: train[c] for c in answered}))
        sizes = {c: m.scalars[NUM_EXAMPLES] for c, m in replies.items()}
        n = sum(sizes.values())
        loss = sum(replies[c].scalars[TRAIN_LOSS] * sizes[c] for c in sorted(replies)) / max(n, 1)
        info = {"train_loss": loss, "clients": len(answered), "n_train": int(n)}
        if rejected:  # replies dropped before aggregation (secure aggregation's too): who, and why
            info["rejected"] = {str(c): why for c, why in sorted(rejected.items())}
        if self.setup_rejected:  # the setup exchange's, told once, in the round after it
            info["rejected_setup"] = {str(c): why for c, why in sorted(self.setup_rejected.items())}
            self.setup_rejected = {}
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

    def _ask_again(self, exchange: str, work: Mapping[ClientId, Any], replies: dict[ClientId, Message],
                   rejected: dict[ClientId, str], problem: Callable[[ClientId, object], str | None],
                   ) -> tuple[dict[ClientId, Message], dict[ClientId, str]]:
        """A runtime whose clients can answer a message again (Flower's, under late_sites =
        "wait": `FlowerClients.ask_again`) is asked for each dropped reply again, up to
        `asks_again` times; the replies come back in the clients' order, as the first ones did."""
        for _ in range(getattr(self.clients, "asks_again", 0)):
            if not rejected:
                break
            for client, why in sorted(rejected.items(), key=lambda item: str(item[0])):
                log.warning("%s (seed %s), %s: dropped client %r's reply: %s; asking for it again", self.algorithm.name,
                            self.seed, exchange, client, why)
            again, rejected = split_replies(self.clients.ask_again(rejected), problem)
            replies = {c: replies[c] if c in replies else again[c] for c in work if c in replies or c in again}
        return replies, rejected

    def _tell(self, exchange: str, rejected: Mapping[ClientId, str]) -> None:
        """Each dropped reply, on the terminal (and in the run's log: `fedcare.studies.run_record`)."""
        for client, why in sorted(rejected.items(), key=lambda item: str(item[0])):
            log.warning("%s (seed %s), %s: dropped client %r's reply: %s", self.algorithm.name, self.seed, exchange,
                        client, why)

    def _check_left(self, exchange: str, asked: int, replies: Mapping[ClientId, Message],
                    rejected: Mapping[ClientId, str]) -> None:
        """Tell the dropped replies; stop when fewer valid replies are left than the exchange
        needs: one, or the deployment's quorum (`min_replies`) of those asked."""
        self._tell(exchange, rejected)
        needed = max(1, min(getattr(self.clients, "min_replies", 1), asked))
        if rejected and len(replies) < needed:
            raise InvalidReplies(f"{self.algorithm.name} (seed {self.seed}), {exchange}: {len(replies)} valid "
                                 f"{'reply' if len(replies) == 1 else 'replies'} left of {asked} (needed {needed}); "
                                 f"dropped {describe_rejected(rejected)}")

    def _aggregate(self, phase: str, rnd: int, replies: Mapping[ClientId, Message],
                   rejected: Mapping[ClientId, str]) -> Message:
        """The server half's new global message; one that is not finite is never kept (a
        checkpoint holding it could never be resumed): the training of this method stops."""
        try:
            new = self.server.aggregate(self.global_message, replies)
        except UserError as e:  # too few replies for a robust rule, say: after the drops, tell them
            if not rejected:
                raise
            raise InvalidReplies(f"{e}; dropped before it: {describe_rejected(rejected)}") from e
        problem = global_problem(new)
        if problem:
            raise TrainingDiverged(f"training diverged: round {rnd} of phase {phase!r}: the aggregate of "
                                   f"{len(replies)} valid {'reply' if len(replies) == 1 else 'replies'} "
                                   f"({type(self.server).__name__}) {problem.removeprefix('tensor ')}; the model "
                                   f"before it is kept")
        return new

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
