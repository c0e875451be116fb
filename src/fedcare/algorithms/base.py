"""An algorithm is a client half and a server half exchanging only `Message`s.

The client half turns (working model, global message, its private state, its data) into an
outgoing message and a new private state; the server half turns the replies into the next
global message. Neither knows which runtime drives it (in-process simulator or Flower).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.split import SHARE_ALL, ParameterSplit, load_tensors
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, predict, train_epochs

# A client's id: a number (the pain study's subjects) or a name (a site); ids of one
# federation are all of one kind, so they sort (aggregation runs in sorted client order).
ClientId = int | str

NUM_EXAMPLES = "num_examples"
TRAIN_LOSS = "train_loss"
DP_EPSILON = "dp_epsilon"  # a client's DP-SGD epsilon so far (`fedcare.privacy.dp_sgd`): public, not data
PRIVACY_METRICS = "privacy"  # `evaluate` with these metrics: what a DP-SGD client has spent (DPSGDClient.spent)
DP_SKIPPED = "dp_skipped"  # a fit's reply: 1.0 when DP-SGD's budget allowed no step (the client did not train)
# Client-state entries that are not model tensors (FedDG's amplitude bank, FedDyn's gradient
# term) are named with this prefix, so `load` knows what belongs in the model.
EXTRA = "extra/"

# What a server half's `aggregate` reads of a round's replies (`ServerHalf.needs`; the rules that
# follow from it are in `fedcare.algorithms.capabilities`).
Needs = Literal["mean", "sum", "each"]


@dataclass(frozen=True)
class PrivateFinetune:
    """A client half's `after_aggregation`, declared (`ClientHalf.batched_finetune`) so a
    runtime may run it for many clients at once (`fedcare.runtime.vectorised`): load the
    global message, train the private parameters for `epochs` at `lr` by the training loop
    (batches from rng.torch("finetune-order")) inside `frozen(model)`, which freezes the shared
    part and yields the private parameters' names; the new state is the private tensors."""

    epochs: int
    lr: float
    frozen: Callable[[nn.Module], AbstractContextManager[set[str]]]


class ClientHalf:
    """FedAvg's client: train every layer for E epochs, send the shared tensors.

    What a runtime or a protection may rely on is declared (`fedcare.algorithms.capabilities`
    reads it): a subclass that changes what the declarations say declares otherwise."""

    # every gradient step goes through the training loop (and its gradient hook): DP-SGD can apply
    trains_in_loop: ClassVar[bool] = True
    # `fit` is this class's (every parameter trained by `train_epochs` with `settings`, the reply
    # and state from `outgoing`), so many clients' fits may run as one batched step
    # (`fedcare.runtime.vectorised`); a half with a fit of its own declares False
    batched_fit: ClassVar[bool] = True
    # `evaluate` with PRIVACY_METRICS answers what the client has spent (a DP-SGD ledger)
    reports_privacy: ClassVar[bool] = False

    def __init__(self, settings: TrainSettings, split: ParameterSplit = SHARE_ALL):
        self.settings = settings
        self.split = split

    def init_state(self, model: nn.Module) -> ClientState:
        """Step (0) of PFDL: every client's private part starts as the initial model's."""
        return self.split.private_tensors(model)

    def load(self, model: nn.Module, message: Message, state: ClientState) -> nn.Module:
        """Put the model this client would use into `model`: shared from the server, private own."""
        load_tensors(model, message.tensors)
        load_tensors(model, {k: v for k, v in state.items() if not k.startswith(EXTRA)})
        return model

    def outgoing(self, model: nn.Module, n: int, loss: float) -> tuple[Message, ClientState]:
        message = Message(self.split.shared_tensors(model), {NUM_EXAMPLES: float(n), TRAIN_LOSS: loss})
        return message, self.split.private_tensors(model)

    def fit(
        self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness
    ) -> tuple[Message, ClientState]:
        self.load(model, message, state).train()
        loss = train_epochs(model, model.parameters(), data, self.settings, generator=rng.torch("fit-order"),
                            round=rng.round)
        return self.outgoing(model, len(data), loss)

    def after_aggregation(
        self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness
    ) -> ClientState:
        """Runs on each participating client once the new global message exists (PFDL's
        fine-tuning). The default keeps the state as it is."""
        return state

    # -- what a runtime may batch over clients (fedcare.runtime.vectorised) ---------------
    def batched_finetune(self) -> PrivateFinetune | None:
        """What `after_aggregation` does, when it is a `PrivateFinetune` (PFDL's); None: it is
        not (the default keeps the state), so a runtime runs it client by client."""
        return None

    def setup(
        self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness
    ) -> Message | None:
        """A one-off exchange before training (FedAP's feature statistics, FedDG's amplitude
        bank). None: this algorithm has no setup."""
        return None

    def receive_setup(self, message: Message, state: ClientState) -> ClientState:
        """Takes the server's setup answer (e.g. the amplitude bank) into the client's state."""
        return state

    def exchange(self, name: str, message: Message, state: ClientState) -> tuple[Message, ClientState]:
        """A named exchange of a protocol around the algorithm (secure aggregation's keys,
        shares and unmasking, `fedcare.privacy.secagg`): a reply and the new state."""
        raise ValueError(f"{type(self).__name__} has no exchange {name!r}")

    def evaluate(self, model: nn.Module, message: Message, state: ClientState, data: ClientData, metrics: str,
                 rng: Randomness | None = None) -> dict:
        """The metrics `metrics` (a kind the task knows, e.g. "binary") of the model this client
        would use, computed here on its own data: only the metrics leave the client. `rng`
        (seed, "evaluate", client) is for evaluations that draw (tuning, sampled pairs)."""
        task = self.settings.task
        scores, loss = predict(self.load(model, message, state), data, task, self.settings.eval_batch_size,
                               self.settings.precision)
        return task.metrics(metrics, scores, loss, data)



class DelegatingClient(ClientHalf):
    """Another client half (`inner`) with some of its operations changed: what a subclass does
    not override goes to `inner`, and `settings`, `split` and `trains_in_loop` are inner's, so
    a change of settings (DP-SGD's gradient hook) reaches the half that trains, through any
    number of wrappers. Its fit is not the library's to batch: a wrapper changes what it does."""

    batched_fit: ClassVar[bool] = False

    def __init__(self, inner: ClientHalf):  # no ClientHalf.__init__: settings and split are inner's
        self.inner = inner

    @property
    def settings(self) -> TrainSettings:
        return self.inner.settings

    @settings.setter
    def settings(self, value: TrainSettings) -> None:
        self.inner.settings = value

    @property
    def split(self) -> ParameterSplit:
        return self.inner.split

    @property
    def trains_in_loop(self) -> bool:  # type: ignore[override]
        return self.inner.trains_in_loop

    @property
    def reports_privacy(self) -> bool:  # type: ignore[override]
        return self.inner.reports_privacy

    def init_state(self, model: nn.Module) -> ClientState:
        return self.inner.init_state(model)

    def load(self, model: nn.Module, message: Message, state: ClientState) -> nn.Module:
        return self.inner.load(model, message, state)

    def outgoing(self, model: nn.Module, n: int, loss: float) -> tuple[Message, ClientState]:
        return self.inner.outgoing(model, n, loss)

    def fit(self, model, message, state, data, rng):
        return self.inner.fit(model, message, state, data, rng)

    def after_aggregation(self, model, message, state, data, rng):
        return self.inner.after_aggregation(model, message, state, data, rng)

    def setup(self, model, message, state, data, rng):
        return self.inner.setup(model, message, state, data, rng)

    def receive_setup(self, message: Message, state: ClientState) -> ClientState:
        return self.inner.receive_setup(message, state)

    def exchange(self, name: str, message: Message, state: ClientState) -> tuple[Message, ClientState]:
        return self.inner.exchange(name, message, state)

    def evaluate(self, model, message, state, data, metrics, rng=None):
        return self.inner.evaluate(model, message, state, data, metrics, rng)

class ServerHalf:
    """Weighted average of the shared tensors, in a fixed order (sorted by client id):
    float sums depend on order, and replies may arrive in any order.

    What it needs is declared, and read in one place (`fedcare.algorithms.capabilities`): a
    subclass with a rule of its own declares what that rule reads."""

    # what `aggregate` reads of a round's replies:
    # "mean": their weighted mean is the new global message (this class's `aggregate`);
    # "sum":  their weighted sum only (it arrives as one reply, their weighted mean, under
    #         secure aggregation), to which a rule of its own applies (a server optimizer's step);
    # "each": each reply by itself (FedAP's personal aggregates, FedDyn's correction, q-FedAvg's
    #         loss weights, a robust rule, client-level DP's clipping).
    needs: ClassVar[Needs] = "mean"
    # a one-off exchange before training (`setup`: FedAP's statistics, FedDG's amplitudes): each
    # client's reply reaches the server by itself
    has_setup: ClassVar[bool] = False
    # its `aggregate` is a step from its `inner` server's aggregate alone (a server optimizer):
    # what replaces or noises the inner's mean (a robust rule, client-level DP) goes inside it
    steps_from_inner: ClassVar[bool] = False

    def __init__(self, split: ParameterSplit = SHARE_ALL, weighting: str = "examples"):
        if weighting not in ("examples", "uniform"):
            raise ValueError(f"weighting must be 'examples' or 'uniform', got {weighting!r}")
        self.split = split
        self.weighting = weighting

    def initial_message(self, model: nn.Module) -> Message:
        return Message(self.split.shared_tensors(model))

    def setup(self, replies: Mapping[ClientId, Message]) -> Mapping[ClientId, Message] | None:
        """Receives the clients' setup messages (see `ClientHalf.setup`); may answer each client."""
        return None

    def reply_problem(self, reply: Message) -> str | None:
        """Why `aggregate` cannot use this client's fit reply (None: it can), beyond what every
        reply is checked for (`fedcare.runtime.replies`: the tensors sent back with their shapes
        and dtypes, finite values, a valid count and loss): a scalar of its own rule."""
        return None

    def setup_reply_problem(self, reply: Message) -> str | None:
        """Why `setup` cannot use this client's reply (None: it can), beyond what every reply is
        checked for (`fedcare.runtime.replies`: finite floating-point tensors, a valid count)."""
        return None

    def message_for(self, client: ClientId, message: Message) -> Message:
        """What `client` receives: the global message, or its own payload (FedAP)."""
        return message

    def weights(self, replies: Mapping[ClientId, Message]) -> dict[ClientId, float]:
        raw = {c: (m.scalars[NUM_EXAMPLES] if self.weighting == "examples" else 1.0) for c, m in replies.items()}
        total = sum(raw.values())
        return {c: w / total for c, w in raw.items()}

    def aggregate(self, current: Message, replies: Mapping[ClientId, Message]) -> Message:
        if not replies or not current.tensors:
            return current
        weights = self.weights(replies)
        order = sorted(replies)
        averaged = {}
        for name, old in current.tensors.items():
            acc = torch.zeros(old.shape, dtype=torch.float64, device=old.device)  # messages are on the CPU
            for client in order:
                acc += weights[client] * replies[client].tensors[name].double()
            averaged[name] = acc.round().to(old.dtype) if not old.is_floating_point() else acc.to(old.dtype)
        return Message(averaged)

    # -- what a server that draws noise or spends a budget adds (client-level DP) ------------
    def bind_seed(self, seed: int) -> None:
        """The run seed its random draws derive from (set by the federation); none here."""

    def over_budget(self, clients: list[ClientId]) -> list[ClientId]:
        """Of `clients`, those left out of the next round (their privacy budget is spent)."""
        return []

    def spent_per_client(self) -> dict[str, float] | None:
        """Each client's privacy spent so far, for the round's record (None: nothing to record)."""
        return None


class DelegatingServer(ServerHalf):
    """Another server half (`inner`) with its aggregation changed: its split, weighting,
    initial message, setup and per-client messages are inner's, and so are its declarations
    (`needs`, `has_setup`) unless a subclass declares its own."""

    def __init__(self, inner: ServerHalf):  # no ServerHalf.__init__: split and weighting are inner's
        self.inner = inner

    @property
    def needs(self) -> Needs:  # type: ignore[override]
        return self.inner.needs

    @property
    def has_setup(self) -> bool:  # type: ignore[override]
        return self.inner.has_setup

    @property
    def split(self) -> ParameterSplit:  # type: ignore[override]
        return self.inner.split

    @property
    def weighting(self) -> str:  # type: ignore[override]
        return self.inner.weighting

    def initial_message(self, model: nn.Module) -> Message:
        return self.inner.initial_message(model)

    def setup(self, replies: Mapping[ClientId, Message]) -> Mapping[ClientId, Message] | None:
        return self.inner.setup(replies)

    def reply_problem(self, reply: Message) -> str | None:
        return self.inner.reply_problem(reply)

    def setup_reply_problem(self, reply: Message) -> str | None:
        return self.inner.setup_reply_problem(reply)

    def message_for(self, client: ClientId, message: Message) -> Message:
        return self.inner.message_for(client, message)

    def weights(self, replies: Mapping[ClientId, Message]) -> dict[ClientId, float]:
        return self.inner.weights(replies)

    def bind_seed(self, seed: int) -> None:
        self.inner.bind_seed(seed)

    def over_budget(self, clients: list[ClientId]) -> list[ClientId]:
        return self.inner.over_budget(clients)

    def spent_per_client(self) -> dict[str, float] | None:
        return self.inner.spent_per_client()


@dataclass
class Algorithm:
    name: str
    client: ClientHalf
    server: ServerHalf
    pooled: bool = False  # centralized: one participant holding every client's data
    # collects a round's fit replies as one masked sum instead (fedcare.privacy.secagg.SecureAggregation)
    secure: Any = None
    # reads the clients' privacy reports each round, (run seed, {client: report}) -> what the round's
    # info adds (fedcare.privacy.canaries.CanaryAudit: the one-run audit's epsilon-hat)
    auditor: Any = None
