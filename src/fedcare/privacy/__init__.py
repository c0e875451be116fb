"""The privacy layer: protections a study's experiment turns on in `[privacy]` (DP-SGD at
each client, client-level DP at the server, secure aggregation) and the one-run audits of
`[privacy.audit]` (canaries), applied to any study's model and algorithms
(`fedcare.studies.compose` calls `private_model` and `private_algorithm`), in the simulator and
on Flower alike. See docs/privacy.md."""

from __future__ import annotations

import math
from dataclasses import replace

from torch import nn

from fedcare.algorithms.base import Algorithm
from fedcare.algorithms.capabilities import dp_sgd_problem, own_rule, secure_aggregation_problem, with_mean_replaced
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
    """`algorithm` with its client half under DP-SGD, its server's mean under client-level DP
    and its replies under secure aggregation, as `privacy` asks, and the one-run audits of
    `[privacy.audit]` (gradient canaries in the client half, their auditor with the algorithm;
    canary clients in the client-level DP server); an error saying why for an algorithm a
    protection cannot cover (the rules: `fedcare.algorithms.capabilities`). Call it once per
    algorithm (`fedcare.studies.compose` does): each call wraps again."""
    if privacy is None:
        return algorithm
    client, server = algorithm.client, algorithm.server
    if privacy.dp_sgd is not None:
        why = dp_sgd_problem(algorithm)
        if why:
            raise PrivacyError(f"privacy.dp_sgd: {why}, where DP-SGD's per-example clipping cannot reach")
        client = DPSGDClient(client, privacy.dp_sgd)
    audit, auditor = privacy.audit, algorithm.auditor
    # the one-run audits: gradient canaries in the client half (example level), canary clients in client-level DP
    if audit is not None and audit.canaries:
        why = dp_sgd_problem(algorithm)
        if why:
            raise PrivacyError(f"privacy.audit.canaries: {why}, where the canaries' gradients cannot join")
        dp = privacy.dp_sgd
        norm = dp.max_grad_norm if dp is not None and math.isfinite(dp.max_grad_norm) else 1.0  # C, else 1
        client, auditor = CanaryClient(client, audit.canaries, norm), CanaryAudit(audit.canaries, privacy.delta,
                                                                                  audit.confidence)
    if audit is not None and audit.canary_clients and privacy.client_dp is None:
        raise PrivacyError("privacy.audit.canary_clients: canary clients join client-level DP's clipped updates, at "
                           "its clipping norm and before its noise; add [privacy.client_dp] (noise_multiplier = 0 "
                           "audits a run without noise)")
    if privacy.client_dp is not None:
        if algorithm.pooled:
            raise PrivacyError(f"privacy.client_dp: {algorithm.name} has one participant holding all the data; "
                               f"client-level DP needs clients")
        why = own_rule(algorithm)
        if why:
            raise PrivacyError(f"privacy.client_dp: {why}, so noise on a mean would not protect what it releases; "
                               f"client-level DP applies to algorithms whose server takes the mean (FedAvg, FedProx, "
                               f"FedBN, FedPer, FedRep, FedDG, PFDL), also under a server optimizer")
        canary_clients, confidence = (audit.canary_clients, audit.confidence) if audit is not None else (0, 0.95)
        server = with_mean_replaced(server, lambda mean: ClientDPServer(mean, privacy.client_dp, algorithm.name,
                                                                        canary_clients, confidence))
    secure = algorithm.secure
    # centralized training holds the pooled data in one process: no update leaves a client to hide
    if privacy.secure_aggregation is not None and not algorithm.pooled:
        why = (("client-level DP (privacy.client_dp) clips each client's update at the server, which secure "
                "aggregation hides; use one or the other") if privacy.client_dp is not None
               else secure_aggregation_problem(algorithm))
        if why:
            raise PrivacyError(f"privacy.secure_aggregation: {algorithm.name} cannot run under secure aggregation: "
                               f"{why}")
        client, secure = SecureAggClient(client), SecureAggregation(privacy.secure_aggregation.threshold)
    return replace(algorithm, client=client, server=server, secure=secure, auditor=auditor)


__all__ = ["PrivacyError", "private_algorithm", "private_model"]
