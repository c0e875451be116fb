"""What client and server halves exchange: named tensors plus scalars, nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Message:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)

    def clone(self) -> "Message":
        return Message({k: v.detach().clone() for k, v in self.tensors.items()}, dict(self.scalars))


# A client's private, serializable record (private layers, BatchNorm statistics, ...): the
# client owns it and the server never sees it. Plain dict of tensors so torch.save stores it.
ClientState = dict[str, torch.Tensor]


def clone_state(state: ClientState) -> ClientState:
    return {k: v.detach().clone() for k, v in state.items()}
