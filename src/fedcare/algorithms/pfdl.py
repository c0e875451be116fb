"""PFDL / federated personalization (Tobis thesis Algorithm 2, Rudovic et al. 2021).

The conv blocks with their BatchNorm (`shared_paths`, default the model's `features`) are
shared and averaged; the dense layers stay private. After each aggregation a client loads the
averaged conv blocks, freezes them for real (no gradients, BatchNorm in inference mode as a
frozen Keras layer runs), trains only its private layers for F epochs at lr / factor, then
unfreezes. The thesis code set `trainable=False` without recompiling, which may not have
frozen anything; we freeze truly, as the thesis describes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from fedcare.algorithms.base import Algorithm, ClientHalf, PrivateFinetune, ServerHalf
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.split import ParameterSplit
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, train_epochs


class PFDLClient(ClientHalf):
    def __init__(self, settings: TrainSettings, split: ParameterSplit, finetune_epochs: int, lr_factor: float):
        super().__init__(settings, split)
        self.finetune_epochs = finetune_epochs
        self.lr_factor = lr_factor

    def after_aggregation(
        self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness
    ) -> ClientState:
        self.load(model, message, state).train()
        with self.frozen_shared(model) as private:
            train_epochs(
                model, [p for name, p in model.named_parameters() if name in private], data, self.settings,
                epochs=self.finetune_epochs, lr=self.finetune_lr, generator=rng.torch("finetune-order"),
                round=rng.round,
            )
        return self.split.private_tensors(model)

    def batched_finetune(self) -> PrivateFinetune:
        return PrivateFinetune(self.finetune_epochs, self.finetune_lr, self.frozen_shared)  # after_aggregation's

    @property
    def finetune_lr(self) -> float:
        return self.settings.lr / self.lr_factor

    @contextmanager
    def frozen_shared(self, model: nn.Module) -> Iterator[set[str]]:
        """The shared blocks frozen while the private part fine-tunes (yields the private
        parameters' names); afterwards every parameter trains again and the model is in train mode."""
        shared = set(self.split.shared_keys(model))
        for _, module in self.split.shared_modules(model):
            module.training = False  # a frozen block's BatchNorm uses, and keeps, its running statistics
        frozen_params = [p for name, p in model.named_parameters() if name in shared]
        for p in frozen_params:
            p.requires_grad_(False)
        try:
            yield {name for name, _ in model.named_parameters() if name not in shared}
        finally:
            for p in frozen_params:
                p.requires_grad_(True)
            model.train()


def pfdl(
    settings: TrainSettings,
    weighting: str = "examples",
    shared_paths: tuple[str, ...] = ("features",),
    finetune_epochs: int = 5,
    lr_factor: float = 10.0,
) -> Algorithm:
    split = ParameterSplit(tuple(shared_paths))
    return Algorithm("pfdl", PFDLClient(settings, split, finetune_epochs, lr_factor), ServerHalf(split, weighting))
