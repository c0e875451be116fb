"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for
Personalized Federated Learning", ICML 2021), as the surgical thesis runs it (§4.1.7).

The model is a shared body (representation φ) and a private head ψ_k, declared by module
path (`head_paths`, default `classifier`: the thesis's three final fully-connected layers).
Each round a client

  1. loads the global body and its own head;
  2. trains the head only for `head_epochs` (E_head = 1), the body frozen;
  3. trains the body only for `body_epochs` (E_repr = 1), the head frozen;
  4. sends the body only (parameters and buffers); the head stays in its state.

"Frozen" means truly frozen: no gradients (`requires_grad=False`, so the optimizer never sees
the tensors) and the frozen part's modules in inference mode. So while the head trains, a
BatchNorm in the body normalises with, and keeps, its running statistics (they are part of
the shared body, and the head phase must not change what is sent); Dropout in the frozen
part is off. Likewise a BatchNorm in the head keeps its running statistics during the body
phase. The authors' code only switches `requires_grad`, so there the body's BatchNorm
statistics also move during the head epochs; we follow the description instead.
Modules that contain both parts (the model itself, a container holding body and head)
stay in training mode. Everything is unfrozen and back in training mode after `fit`.

Choices where the papers are silent:
- Head and body epochs use separate generators ("fedrep-head-order", "fedrep-body-order"),
  so the head phase does not depend on `body_epochs`, and vice versa.
- `train_loss` is the last body epoch's mean loss (the head phase's if `body_epochs=0`).
- Both phases run at the settings' learning rate (the thesis gives one local LR).
- Averaging weighted by example count, as the surgical thesis's WAVG for every algorithm
  (Collins et al. average uniformly: pass weighting="uniform").
"""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn

from fedcare.algorithms.base import Algorithm, ClientHalf, ServerHalf
from fedcare.algorithms.fedper import DEFAULT_HEAD, head_split
from fedcare.algorithms.split import ParameterSplit
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, train_epochs


def _ancestors(path: str) -> set[str]:
    parts = path.split(".") if path else []
    return {".".join(parts[:i]) for i in range(len(parts))}


@contextmanager
def train_only(model: nn.Module, split: ParameterSplit, part: str):
    """Within the block, only `part` ("head" or "body") has gradients and runs in training
    mode; the other part's parameters are frozen and its modules are in inference mode."""
    if part not in ("head", "body"):
        raise ValueError(f"part must be 'head' or 'body', got {part!r}")
    shared = set(split.shared_keys(model))
    frozen = [p for name, p in model.named_parameters() if (name in shared) == (part == "head")]
    head_modules = [path for path, _ in model.named_modules() if split.in_private_path(path)]
    mixed = set().union(*(_ancestors(path) for path in head_modules)) if head_modules else set()
    was_training = model.training
    model.train()
    for path, module in model.named_modules():
        if path in mixed:
            continue  # holds both parts (e.g. the model itself)
        if split.in_private_path(path) != (part == "head"):
            module.training = False
    flags = [p.requires_grad for p in frozen]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield [p for p in model.parameters() if p.requires_grad]
    finally:
        for p, flag in zip(frozen, flags):
            p.requires_grad_(flag)
        model.train(was_training)


class FedRepClient(ClientHalf):
    batched_fit = False  # a fit of its own: not the library's to batch over clients

    def __init__(self, settings: TrainSettings, split: ParameterSplit, head_epochs: int = 1, body_epochs: int = 1):
        super().__init__(settings, split)
        if head_epochs < 0 or body_epochs < 0:
            raise ValueError(f"epochs must be >= 0, got head {head_epochs}, body {body_epochs}")
        self.head_epochs = int(head_epochs)
        self.body_epochs = int(body_epochs)

    def fit(
        self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness
    ) -> tuple[Message, ClientState]:
        self.load(model, message, state).train()
        loss = float("nan")
        for part, epochs in (("head", self.head_epochs), ("body", self.body_epochs)):
            if epochs == 0:
                continue
            with train_only(model, self.split, part) as params:
                loss = train_epochs(model, params, data, self.settings, epochs=epochs,
                                    generator=rng.torch(f"fedrep-{part}-order"), round=rng.round)
        return self.outgoing(model, len(data), loss)


class FedRepServer(ServerHalf):
    """Averages the body (the only part it ever receives)."""


def fedrep(
    settings: TrainSettings,
    head_paths: tuple[str, ...] = DEFAULT_HEAD,
    head_epochs: int = 1,
    body_epochs: int = 1,
    weighting: str = "examples",
) -> Algorithm:
    """FedRep with the surgical thesis's E_head = E_repr = 1 and the `classifier` block as head."""
    split = head_split(head_paths)
    return Algorithm("fedrep", FedRepClient(settings, split, head_epochs, body_epochs), FedRepServer(split, weighting))
