"""The one place a study's model and algorithms get the experiment's protection stack.

A study writes its own `new_model()` and `algorithm(name)`, plain: what the papers train.
Everything that runs them (the simulator, the Flower coordinator and sites, the protocols)
builds them through `Composed` (`Study.composed`), which puts the stack around them here and
nowhere else, once per model or algorithm:

    algorithm: the study's -> attack ([robustness.attack]) -> robust rule ([robustness] rule)
               -> privacy ([privacy]: DP-SGD, client-level DP, secure aggregation) -> precision
    model:     the study's, built on the host -> privacy (DP-SGD's GroupNorm) -> the run's device

The attackers poison inside the protections (before secure aggregation's masks), as a real
attacker would. A study that subclasses another inherits plain methods, so it is composed once
like any other. What each layer accepts is in `fedcare.algorithms.capabilities`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

import torch
from torch import nn

from fedcare.algorithms.attack import attacking_algorithm
from fedcare.algorithms.base import Algorithm
from fedcare.algorithms.robust import robust_algorithm
from fedcare.config import Experiment
from fedcare.device import Compute
from fedcare.privacy import private_algorithm, private_model


class Plain(Protocol):
    """What the stack is put around: a `fedcare.studies.base.Study` bound to its experiment."""

    config: Experiment
    compute: Compute

    def new_model(self, *args: Any, **kwargs: Any) -> nn.Module: ...

    def algorithm(self, name: str) -> Algorithm: ...


class Composed:
    """A study's model and algorithms with its experiment's stack around them: what every
    runtime builds from (a `fedcare.runtime.sites.Builder`)."""

    def __init__(self, study: Plain):
        self.study = study

    @property
    def config(self) -> Experiment:
        return self.study.config

    @property
    def compute(self) -> Compute:
        """Where this process computes (the experiment's `[runtime]`, resolved on this machine)."""
        return self.study.compute

    def new_model(self, *args: Any, **kwargs: Any) -> nn.Module:
        """The study's model (its own arguments, e.g. the face study's classes) as the
        protections need it, on the run's device."""
        with torch.device("cpu"):  # built on the host, then moved: the same initial weights on every device
            model = private_model(self.study.new_model(*args, **kwargs), self.config.privacy)
        return self.compute.place(model)

    def algorithm(self, name: str) -> Algorithm:
        """The study's algorithm `name` inside the stack (see the module docstring); an error
        saying why for a layer that cannot cover it."""
        algorithm = self.study.algorithm(name)
        robustness = self.config.robustness
        if robustness is not None:
            algorithm = robust_algorithm(attacking_algorithm(algorithm, robustness.attack), robustness)
        algorithm = private_algorithm(algorithm, self.config.privacy)
        precision = self.compute.precision
        if precision != algorithm.client.settings.precision:  # reaches the half that trains (DelegatingClient)
            algorithm.client.settings = replace(algorithm.client.settings, precision=precision)
        return algorithm
