"""The privacy layer: protections a study's experiment turns on in `[privacy]` (DP-SGD at
each client, client-level DP at the server), applied to any study's model and algorithms
(`fedcare.studies.base.Study` calls `private_model` and `private_algorithm`), in the
simulator and on Flower alike. See docs/privacy.md."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from fedcare.algorithms.base import Algorithm
from fedcare.config import Privacy
from fedcare.privacy.client_dp import ClientDPServer
from fedcare.privacy.dp_sgd import DPSGDClient, PrivacyError, private_model as _dp_sgd_model


def private_model(model: nn.Module, privacy: Privacy | None) -> nn.Module:
    """The study's model as the protections need it (DP-SGD: GroupNorm for BatchNorm)."""
    if privacy is not None and privacy.dp_sgd is not None:
        return _dp_sgd_model(model, privacy.dp_sgd)
    return model


def private_algorithm(algorithm: Algorithm, privacy: Privacy | None) -> Algorithm:
    """`algorithm` with its client half under DP-SGD and its server half under client-level
    DP, as `privacy` asks; an error saying why for an algorithm a protection cannot cover."""
    if privacy is None:
        return algorithm
    client, server = algorithm.client, algorithm.server
    if privacy.dp_sgd is not None and not isinstance(client, DPSGDClient):  # wrapping once
        if not client.trains_in_loop:
            raise PrivacyError(f"privacy.dp_sgd: {algorithm.name} takes gradient steps outside the training loop "
                               f"(its meta step), where DP-SGD's per-example clipping cannot reach")
        client = DPSGDClient(client, privacy.dp_sgd)
    if privacy.client_dp is not None and not isinstance(server, ClientDPServer):
        if algorithm.pooled:
            raise PrivacyError(f"privacy.client_dp: {algorithm.name} has one participant holding all the data; "
                               f"client-level DP needs clients")
        server = ClientDPServer(server, privacy.client_dp, algorithm.name)
    return replace(algorithm, client=client, server=server)


__all__ = ["PrivacyError", "private_algorithm", "private_model"]
