"""The privacy layer: protections a study's experiment turns on in `[privacy]` (DP-SGD at
each client, client-level DP at the server, secure aggregation) and the one-run audits of
`[privacy.audit]` (canaries), applied to any study's model and algorithms
(`fedcare.studies.base.Study` calls `private_model` and `private_algorithm`), in the
simulator and on Flower alike. See docs/privacy.md."""

from __future__ import annotations

import math
from dataclasses import replace

from torch import nn

from fedcare.algorithms.base import Algorithm, ServerHalf
from fedcare.algorithms.server_optimizers import OptimizedServer
from fedcare.config import Privacy
from fedcare.privacy.canaries import CanaryAudit, CanaryClient
from fedcare.privacy.client_dp import ClientDPServer
from fedcare.privacy.dp_sgd import DPSGDClient, PrivacyError, private_model as _dp_sgd_model
from fedcare.privacy.secagg import SecureAggClient, SecureAggregation


def private_model(model: nn.Module, privacy: Privacy | None) -> nn.Module:
    """The study's model as the protections need it (DP-SGD: GroupNorm for BatchNorm)."""
    if privacy is not None and privacy.dp_sgd is not None:
        return _dp_sgd_model(model, privacy.dp_sgd)
    return model


def private_algorithm(algorithm: Algorithm, privacy: Privacy | None) -> Algorithm:
    """`algorithm` with its client half under DP-SGD and its server half under client-level
    DP, as `privacy` asks, and the one-run audits of `[privacy.audit]` (gradient canaries in the
    client half, their auditor with the algorithm; canary clients in the client-level DP server);
    an error saying why for an algorithm a protection cannot cover."""
    if privacy is None:
        return algorithm
    client, server = algorithm.client, algorithm.server
    if privacy.dp_sgd is not None and not isinstance(client, DPSGDClient):  # wrapping once
        if not client.trains_in_loop:
            raise PrivacyError(f"privacy.dp_sgd: {algorithm.name} takes gradient steps outside the training loop "
                               f"(its meta step), where DP-SGD's per-example clipping cannot reach")
        client = DPSGDClient(client, privacy.dp_sgd)
    audit, auditor = privacy.audit, algorithm.auditor
    # the one-run audits: gradient canaries in the client half (example level), canary clients in client-level DP
    if audit is not None and audit.canaries and not isinstance(client, CanaryClient):
        if not client.trains_in_loop:
            raise PrivacyError(f"privacy.audit.canaries: {algorithm.name} takes gradient steps outside the training "
                               f"loop (its meta step), where the canaries' gradients cannot join")
        dp = privacy.dp_sgd
        norm = dp.max_grad_norm if dp is not None and math.isfinite(dp.max_grad_norm) else 1.0  # C, else 1
        client, auditor = CanaryClient(client, audit.canaries, norm), CanaryAudit(audit.canaries, privacy.delta,
                                                                                  audit.confidence)
    if audit is not None and audit.canary_clients and privacy.client_dp is None:
        raise PrivacyError("privacy.audit.canary_clients: canary clients join client-level DP's clipped updates, at "
                           "its clipping norm and before its noise; add [privacy.client_dp] (noise_multiplier = 0 "
                           "audits a run without noise)")
    if privacy.client_dp is not None and not isinstance(server, ClientDPServer):
        if algorithm.pooled:
            raise PrivacyError(f"privacy.client_dp: {algorithm.name} has one participant holding all the data; "
                               f"client-level DP needs clients")
        server = ClientDPServer(server, privacy.client_dp, algorithm.name,
                                canary_clients=audit.canary_clients if audit is not None else 0,
                                confidence=audit.confidence if audit is not None else 0.95)
    secure = algorithm.secure
    # centralized training holds the pooled data in one process: no update leaves a client to hide
    if privacy.secure_aggregation is not None and secure is None and not algorithm.pooled:
        refuse_secure_aggregation(algorithm, privacy)
        client, secure = SecureAggClient(client), SecureAggregation(privacy.secure_aggregation.threshold)
    return replace(algorithm, client=client, server=server, secure=secure, auditor=auditor)


def refuse_secure_aggregation(algorithm: Algorithm, privacy: Privacy) -> None:
    """An error saying why, for an algorithm whose server needs what secure aggregation hides:
    the individual replies. A server optimizer (FedAdam, the surgical study's AdamW) needs
    only the average and is accepted."""
    why = None
    inner = algorithm.server.inner if isinstance(algorithm.server, OptimizedServer) else algorithm.server
    if privacy.client_dp is not None:
        why = ("client-level DP (privacy.client_dp) clips each client's update at the server, which secure "
               "aggregation hides; use one or the other")
    elif type(inner).setup is not ServerHalf.setup:
        why = (f"its setup exchange ({type(inner).__name__}.setup: FedAP's feature statistics, FedDG's amplitude "
               f"spectra) sends the server statistics of each client's data one by one")
    elif type(inner).aggregate is not ServerHalf.aggregate or type(inner).message_for is not ServerHalf.message_for:
        why = (f"its server ({type(inner).__name__}) aggregates by its own rule from each client's reply (FedAP's "
               f"personal aggregates, q-FedAvg's per-client losses, FedDyn's correction), not from their sum")
    if why:
        raise PrivacyError(f"privacy.secure_aggregation: {algorithm.name} cannot run under secure aggregation: {why}")


__all__ = ["PrivacyError", "private_algorithm", "private_model"]
