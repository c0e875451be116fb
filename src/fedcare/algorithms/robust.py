"""Robust aggregation for the FedAvg family (`[robustness] rule`, docs/robustness.md): the
server's weighted mean of the replies replaced by a rule that a few hostile or broken replies
cannot drag far, as Flower 1.41's strategies (flwr.serverapp.strategy) compute them, checked
against them in tests/algorithms/test_robust.py:

- "median": the coordinate-wise median of the replies (FedMedian);
- "trimmed_mean": per coordinate, the mean after cutting the `trim_fraction` largest and
  smallest values, int(trim_fraction * n) each (FedTrimmedAvg's beta);
- "krum": the one reply whose n - f - 2 nearest replies are nearest in squared L2 distance
  (Blanchard et al. 2017; f = `byzantine`, Flower's num_malicious_nodes);
- "multi_krum": the mean of the `multi_krum_keep` best-scoring replies (MultiKrum's
  num_nodes_to_select), weighted as the algorithm's mean is (examples or uniform), as
  Flower weights them by example count;
- "bulyan": theta = n - 2f replies chosen by Multi-Krum's scores, then per coordinate the
  mean of the beta = theta - 2f values nearest to their median (El Mhamdi et al. 2018);
  needs n >= 4f + 3 replies.

Choices written down:
- Robust rules ignore how many examples a reply was trained on (Multi-Krum's mean of the
  chosen replies aside): a large site counts as much as a small one, so where sites differ in
  size the result moves towards the small sites. docs/robustness.md, "Site sizes".
- Flower's Bulyan (1.41's Message API) chooses its theta replies in one Multi-Krum pass, as
  here; the paper (and Flower's older `aggregate_bulyan`) re-runs Krum after each pick.
- Krum's distances are over the floating-point tensors only: an integer tensor (BatchNorm's
  batch counter) is no model parameter, and its differences would swamp the weights'; Flower
  concatenates every array. Integer tensors are aggregated by the same rule, rounded.
- Ties between Krum scores go to the earlier client in sorted order (Flower: numpy's order).
- Arithmetic in float64 on the CPU, cast back to each tensor's dtype (Flower: the arrays'
  own dtype, float32 for a torch model), so the two agree to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch

from fedcare.algorithms.base import Algorithm, ClientId, DelegatingServer, ServerHalf
from fedcare.algorithms.capabilities import own_rule, with_mean_replaced
from fedcare.algorithms.messages import Message
from fedcare.config import Robustness
from fedcare.errors import UserError

RULES = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "bulyan")


class RobustAggregationError(UserError, ValueError):
    """A robust rule that cannot apply (to an algorithm, or to a round's number of replies)."""


def fewest_replies(rule: str, byzantine: int, keep: int | None = None) -> int:
    """The fewest replies a round needs under `rule`: Krum's score needs n - f - 2 >= 1 other
    replies (n >= 2f + 3, Blanchard et al.), Multi-Krum also `keep` replies to choose, Bulyan
    n >= 4f + 3 (El Mhamdi et al.; Flower skips a round with fewer)."""
    if rule in ("krum", "multi_krum"):
        return max(2 * byzantine + 3, keep or 1)
    if rule == "bulyan":
        return 4 * byzantine + 3
    return 1


def median(stack: torch.Tensor) -> torch.Tensor:
    """numpy's median along the first axis: the mean of the two middle values for an even count."""
    ordered, n = stack.sort(dim=0).values, len(stack)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(stack: torch.Tensor, fraction: float) -> torch.Tensor:
    """The mean after cutting int(fraction * n) values at each end (scipy's trim_mean, Flower's)."""
    cut = int(fraction * len(stack))
    return stack.sort(dim=0).values[cut:len(stack) - cut].mean(dim=0)


def krum_order(flat: torch.Tensor, byzantine: int) -> list[int]:
    """Rows of `flat` (one reply's floating-point values each) from best to worst Krum score:
    the sum of squared distances to its n - f - 2 nearest other rows (at least 1)."""
    n = len(flat)
    distances = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist").square()
    nearest = max(1, n - byzantine - 2)
    scores = [float(torch.cat([distances[i, :i], distances[i, i + 1:]]).sort().values[:nearest].sum())
              for i in range(n)]
    return sorted(range(n), key=lambda i: (scores[i], i))


def closest_to_median_mean(stack: torch.Tensor, beta: int) -> torch.Tensor:
    """Per coordinate, the mean of the `beta` values nearest to the coordinate's median."""
    nearest = (stack - median(stack)).abs().argsort(dim=0, stable=True)[:beta]
    return stack.gather(0, nearest).mean(dim=0)


class RobustServer(DelegatingServer):
    """A plain-averaging server half (`inner`) with its mean replaced by a robust rule."""

    needs = "each"  # a median, a trimmed mean, Krum's distances: each reply by itself

    def __init__(self, inner: ServerHalf, rule: str, *, trim_fraction: float = 0.2, byzantine: int = 0,
                 keep: int | None = None):
        if rule not in RULES[1:]:
            raise ValueError(f"unknown robust rule {rule!r}: choose one of {', '.join(RULES[1:])}")
        if rule == "multi_krum" and not keep:
            raise ValueError("multi_krum needs keep (the replies to average)")
        super().__init__(inner)
        self.rule, self.trim_fraction, self.byzantine, self.keep = rule, trim_fraction, byzantine, keep

    def aggregate(self, current: Message, replies: Mapping[ClientId, Message]) -> Message:
        if not replies or not current.tensors:
            return current
        order = sorted(replies)
        n, f = len(order), self.byzantine
        need = fewest_replies(self.rule, f, self.keep)
        if n < need:
            raise RobustAggregationError(
                f"robustness: rule {self.rule!r} with byzantine = {f}{f', multi_krum_keep = {self.keep}' if self.keep else ''}"
                f" needs at least {need} replies in a round; this round had {n}")
        if self.rule in ("krum", "multi_krum"):
            best = self.ranked(current, replies, order)[:self.keep if self.rule == "multi_krum" else 1]
            return self.inner.aggregate(current, {c: replies[c] for c in best})  # one reply: itself, exactly
        if self.rule == "bulyan":
            order = sorted(self.ranked(current, replies, order)[:n - 2 * f])
        out = {}
        for name, old in current.tensors.items():
            stack = torch.stack([replies[c].tensors[name].detach().to("cpu", torch.float64) for c in order])
            if self.rule == "median":
                value = median(stack)
            elif self.rule == "trimmed_mean":
                value = trimmed_mean(stack, self.trim_fraction)
            else:
                value = closest_to_median_mean(stack, len(order) - 2 * f)
            out[name] = value.to(old.dtype) if old.is_floating_point() else value.round().to(old.dtype)
        return Message(out)

    def ranked(self, current: Message, replies: Mapping[ClientId, Message], order: Sequence[ClientId]) -> list[ClientId]:
        """The clients in `order` from best to worst Krum score."""
        floats = [k for k, t in current.tensors.items() if t.is_floating_point()]
        flat = torch.stack([torch.cat([replies[c].tensors[k].detach().to("cpu", torch.float64).reshape(-1)
                                       for k in floats]) for c in order])
        return [order[i] for i in krum_order(flat, self.byzantine)]


def robust_algorithm(algorithm: Algorithm, robustness: Robustness | None) -> Algorithm:
    """`algorithm` with its server's mean replaced by `robustness.rule` ("mean": unchanged).
    Applies to servers whose rule is the weighted mean (`needs = "mean"`: FedAvg, FedProx, FedBN,
    FedPer, FedRep, FedDG, PFDL, Per-FedAvg), also under a server optimizer (the surgical study's
    AdamW: the optimizer steps towards the robust aggregate); refuses the others with the reason
    (`fedcare.algorithms.capabilities`)."""
    if robustness is None or robustness.rule == "mean" or algorithm.pooled:
        return algorithm  # centralized: one participant, nothing to aggregate
    why = own_rule(algorithm)
    if why:
        raise RobustAggregationError(f"robustness.rule = {robustness.rule!r}: {why} a robust rule could replace; run "
                                     f"it without [robustness] rule, or drop it from methods")
    return replace(algorithm, server=with_mean_replaced(algorithm.server, lambda mean: RobustServer(
        mean, robustness.rule, trim_fraction=robustness.trim_fraction, byzantine=robustness.byzantine,
        keep=robustness.multi_krum_keep)))


def describe(robustness: Robustness | None) -> str | None:
    """The report's note on what `[robustness]` did (None: nothing)."""
    if robustness is None:
        return None
    r = robustness
    params = {"trimmed_mean": f" (trim_fraction {r.trim_fraction})", "krum": f" (byzantine {r.byzantine})",
              "multi_krum": f" (byzantine {r.byzantine}, keep {r.multi_krum_keep})",
              "bulyan": f" (byzantine {r.byzantine})"}.get(r.rule, "")
    text = (f"Aggregation: {r.rule}{params}; " if r.rule != "mean" else "Aggregation: the weighted mean; ")
    if r.rule not in ("mean", "multi_krum"):
        text += "it ignores how many examples each client trained on (docs/robustness.md). "
    if r.attack is None:
        return text + "No simulated attackers."
    a = r.attack
    return text + (f"Simulated attackers: clients {', '.join(map(str, a.clients))} send {a.kind.replace('_', ' ')} "
                   f"updates{f' (scale {a.effective_scale})' if a.kind != 'label_flip' else ''}: this run's numbers "
                   f"show an attack, not the method's quality.")


def clients_problem(robustness: Robustness | None, clients: Sequence[ClientId]) -> str | None:
    """Why `robustness` cannot run over these `clients` (the experiment's; None: it can):
    attackers that are no client, or a rule needing more replies than there are clients."""
    from fedcare.algorithms.attack import unknown_attackers

    if robustness is None:
        return None
    need = fewest_replies(robustness.rule, robustness.byzantine, robustness.multi_krum_keep)
    if len(clients) < need:
        return (f"robustness.rule = {robustness.rule!r} with byzantine = {robustness.byzantine} needs at least {need} "
                f"replies a round ({'4f + 3' if robustness.rule == 'bulyan' else '2f + 3, and multi_krum_keep'}), "
                f"and this experiment has {len(clients)} clients")
    return unknown_attackers(robustness.attack, clients)
