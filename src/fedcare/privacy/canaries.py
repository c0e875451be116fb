"""The one-run audit of example-level DP (Steinke, Nasr & Jagielski 2023; `fedcare.privacy.one_run`)
inside any client half: `[privacy.audit] canaries = m`.

Each client holds m **gradient canaries** (the paper's white-box "Dirac" canaries): canary i is
an example whose gradient is C times the unit vector of one coordinate j_i of the model (C: DP-SGD's
clipping norm; 1 without DP-SGD), the m coordinates distinct, drawn from (run seed, "canaries",
client, "coordinates"). Each canary is included in the client's data independently with
probability 1/2, from (run seed, "canaries", client, "included"): the auditor (`CanaryAudit`, at
the server) draws the same bits and keeps them; the client does not report them. An included
canary joins each training step as an example would: with the step's sampling rate q =
batch_size / n (Poisson, independently of the others, from the client's own generator
(..., "canaries/<fit|after-aggregation>")), its gradient added to the sum of the clipped
per-example gradients before DP-SGD's noise (`PerExampleClipNoise.canaries`), and divided by the
same public batch size; without DP-SGD it is added to the batch's mean gradient (/ batch_size).
A canary is never data: nothing evaluates it, and what leaves the client is one score per
canary, the model's move against its coordinate since the client first trained
(theta_start[j_i] - theta_now[j_i]: training steps against the canary's gradient), returned with
the client's privacy report (`PRIVACY_METRICS`), which every round of a run with DP-SGD or canaries
asks for. The server turns the scores and the bits into epsilon-hat per client and pooled
over the round's clients, beside the accountant's epsilon (`Federation.run_round`'s info:
`dp_audit`).

Choices written down:
- The coordinates span every floating-point parameter of the model (shared and private); a
  canary whose parameter a step does not train (PFDL's frozen layers while it fine-tunes) sits
  that step out. The model needs at least m parameters.
- The canaries do not change n, q, the steps or the divisor: the audited run's real batches and
  noise are the same draws as the run without canaries (the canaries draw from their own
  generator); only the canaries' gradients are added.
- A personal model (PFDL, FedBN) is scored as the client uses it; FedAvg's is the global model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from fedcare.algorithms.base import DP_EPSILON, PRIVACY_METRICS, ClientHalf, ClientId, DelegatingClient
from fedcare.algorithms.messages import ClientState
from fedcare.algorithms.training import Randomness
from fedcare.privacy.dp_sgd import PerExampleClipNoise, PrivacyError
from fedcare.privacy.one_run import audit
from fedcare.runtime.clients import PRIVACY_LEDGER
from fedcare.seeding import numpy_rng

ORIGIN = PRIVACY_LEDGER + "canary_origin"  # the model at the canaries' coordinates when the client first trained
SCORES = "canary_scores"  # the privacy report's list: one score per canary
DP_AUDIT = "dp_audit"  # a round's info: the audit per client and pooled


def canary_inclusion(seed: int, client: ClientId, m: int) -> np.ndarray:
    """Which of a client's m canaries are in its data: each with probability 1/2 (the auditor's draw)."""
    return numpy_rng(seed, "canaries", client, "included").random(m) < 0.5


class GradientCanaries:
    """One client's m Dirac canaries on `model`'s floating-point parameters."""

    def __init__(self, model: nn.Module, seed: int, client: ClientId, m: int, norm: float):
        params = [(n, p) for n, p in model.named_parameters() if p.is_floating_point()]
        sizes = np.array([p.numel() for _, p in params], dtype=np.int64)
        d = int(sizes.sum())
        if m > d:
            raise PrivacyError(f"privacy.audit.canaries: {m} gradient canaries need as many parameters, the model "
                               f"has {d}")
        flat = numpy_rng(seed, "canaries", client, "coordinates").choice(d, m, replace=False)
        owner = np.searchsorted(np.cumsum(sizes), flat, side="right")  # the parameter each coordinate is in
        starts = np.r_[0, np.cumsum(sizes)[:-1]]
        # per parameter: which canaries sit in it (their positions in canary order) and where
        self.groups = {params[i][0]: (torch.from_numpy(np.flatnonzero(owner == i)),
                                      torch.from_numpy(flat[owner == i] - starts[i])) for i in np.unique(owner)}
        self.m = m
        self.included = torch.from_numpy(canary_inclusion(seed, client, m))
        self.norm = norm
        self.rate = 0.0
        self.generator: torch.Generator | None = None

    def read(self, model: nn.Module) -> torch.Tensor:
        """The model's value at each canary's coordinate (float64, on the host)."""
        params = dict(model.named_parameters())
        values = torch.zeros(self.m, dtype=torch.float64)
        for name, (positions, offsets) in self.groups.items():
            values[positions] = params[name].detach().flatten().cpu().double()[offsets]
        return values

    def step(self, named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This step's canary gradients, summed per trained parameter: each included canary joins
        with probability `rate`; a canary whose parameter is not in `named` sits the step out."""
        joined = (torch.rand(self.m, generator=self.generator) < self.rate) & self.included
        out: dict[str, torch.Tensor] = {}
        for name, (positions, offsets) in self.groups.items():
            here = offsets[joined[positions]]
            if name in named and len(here):
                grad = torch.zeros(named[name].numel(), dtype=named[name].dtype)
                grad[here] = self.norm  # distinct coordinates: one canary each
                out[name] = grad.reshape(named[name].shape).to(named[name].device)
        return out


class PlainCanaryHook:
    """Without DP-SGD: the joined canaries' gradients added to the batch's mean gradient (/ batch_size)."""

    def __init__(self, canaries: GradientCanaries, batch_size: int, inner=None):
        self.canaries, self.batch_size, self.inner = canaries, batch_size, inner

    def __call__(self, model: nn.Module, batch_size: int) -> None:
        if self.inner is not None:
            self.inner(model, batch_size)
        named = {n: p for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
        for name, grad in self.canaries.step(named).items():
            named[name].grad += grad / self.batch_size


class CanaryClient(DelegatingClient):
    """Any client half (under DP-SGD or not) training with its m gradient canaries, and
    reporting their scores with its privacy report."""

    reports_privacy = True

    def __init__(self, inner: ClientHalf, m: int, norm: float):
        super().__init__(inner)
        self.m, self.norm = m, norm

    def fit(self, model, message, state, data, rng):
        state = self._origin(model, message, state, rng)
        with self._inserted(model, len(data), rng, "fit"):
            reply, new_state = self.inner.fit(model, message, state, data, rng)
        return reply, {**new_state, ORIGIN: state[ORIGIN]}

    def after_aggregation(self, model, message, state, data, rng):
        state = self._origin(model, message, state, rng)
        with self._inserted(model, len(data), rng, "after-aggregation"):
            new_state = self.inner.after_aggregation(model, message, state, data, rng)
        return {**new_state, ORIGIN: state[ORIGIN]}

    def evaluate(self, model, message, state, data, metrics, rng=None):
        if metrics != PRIVACY_METRICS:
            return self.inner.evaluate(model, message, state, data, metrics, rng)
        report = self.inner.evaluate(model, message, state, data, metrics, rng) if self.inner.reports_privacy else {}
        if ORIGIN not in state:  # never trained: nothing to score
            return report
        canaries = self._canaries(model, rng)
        scores = state[ORIGIN] - canaries.read(self.load(model, message, state))
        return {**report, SCORES: [float(s) for s in scores]}

    def _canaries(self, model: nn.Module, rng: Randomness) -> GradientCanaries:
        return GradientCanaries(model, rng.seed, rng.client, self.m, self.norm)

    def _origin(self, model: nn.Module, message, state: ClientState, rng: Randomness) -> ClientState:
        """The model at the canaries' coordinates as the client first receives it (kept with
        the privacy ledgers: never rolled back)."""
        if ORIGIN in state:
            return state
        start = self._canaries(model, rng).read(self.inner.load(model, message, state))
        return {**state, ORIGIN: start}

    @contextmanager
    def _inserted(self, model: nn.Module, n: int, rng: Randomness, purpose: str):
        """The canaries in every step of the inner half's training: through DP-SGD's hook when
        there is one, else a hook of their own."""
        canaries = self._canaries(model, rng)
        canaries.rate = min(1.0, self.settings.batch_size / max(n, 1))
        canaries.generator = rng.torch(f"canaries/{purpose}")
        hook, settings = self.settings.gradient_hook, self.settings
        if isinstance(hook, PerExampleClipNoise):
            hook.canaries = canaries
        else:
            self.settings = replace(settings, gradient_hook=PlainCanaryHook(canaries, settings.batch_size, hook))
        try:
            yield
        finally:
            if isinstance(hook, PerExampleClipNoise):
                hook.canaries = None
            else:
                self.settings = settings


class CanaryAudit:
    """The auditor at the server: each round, from the clients' privacy reports (their canary
    scores and, under DP-SGD, their epsilon) and the inclusion bits it draws itself, the
    one-run audit per client and pooled over them."""

    def __init__(self, m: int, delta: float, confidence: float):
        self.m, self.delta, self.confidence = m, delta, confidence

    def __call__(self, seed: int, reports: Mapping[ClientId, dict]) -> dict:
        per_client, pooled_scores, pooled_bits, epsilons = {}, [], [], []
        for client, report in sorted(reports.items()):
            if SCORES not in report:
                continue
            scores, bits = np.asarray(report[SCORES]), canary_inclusion(seed, client, self.m)
            eps = report.get(DP_EPSILON)
            per_client[str(client)] = self._result(audit(scores, bits, self.delta, self.confidence, eps), eps)
            pooled_scores.append(scores)
            pooled_bits.append(bits)
            epsilons.append(math.inf if eps is None else float(eps))
        if not per_client:
            return {}
        # the pooled claim: every canary is (largest epsilon, delta)-DP
        largest = max(epsilons)
        claim = None if math.isinf(largest) else largest
        pooled = audit(np.concatenate(pooled_scores), np.concatenate(pooled_bits), self.delta, self.confidence, claim)
        return {DP_AUDIT: {"pooled": self._result(pooled, claim),
                           "clients": per_client}}

    @staticmethod
    def _result(result, epsilon: float | None) -> dict:
        return {**result.as_dict(), "epsilon": epsilon}
