"""Every client reply checked before anything aggregates it (`Federation.run_round`,
`Federation.run_setup`: the simulator's and Flower's ServerApp alike).

A site's reply is input from outside the coordinator: a bug, corrupted data or a hostile
site can send anything a `Message` can hold. Before an algorithm's server half, a robust
rule or an observer reads a round's replies, each one is checked against what the server
sent and expects; a reply that fails is dropped as a failed client's, with the reason:

- a fit reply (`fit_reply_problem`) holds exactly the tensors of the message the client
  received (the algorithm's shared tensors: none missing, none extra), each with that
  message's shape and dtype (a 0-d tensor would broadcast into a mean), every value finite;
  a positive, finite, whole example count (`NUM_EXAMPLES`); a finite `TRAIN_LOSS`; what the
  server half's rule reads of it (`ServerHalf.reply_problem`: q-FedAvg's loss at the global model);
- a setup reply (`setup_reply_problem`: FedAP's statistics, FedDG's amplitudes) holds
  finite floating-point tensors, a valid example count if it has one, what the server half
  expects of it (`ServerHalf.setup_reply_problem`), and agrees in names, dtypes and
  per-example shapes with what most clients sent (`disagreeing`);
- any other scalar is a real number, not NaN; only a DP-SGD epsilon may be infinite (no
  noise spends an infinite budget).

Nothing here changes a value or the order of aggregation: a valid reply is passed on as it
came. What to do with the problems (drop, record, stop below quorum) is the federation's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from numbers import Real

import torch

from fedcare.algorithms.base import DP_EPSILON, DP_SKIPPED, NUM_EXAMPLES, TRAIN_LOSS, ClientId
from fedcare.algorithms.messages import Message
from fedcare.errors import UserError


class InvalidReplies(UserError, ValueError):
    """Too few usable replies in an exchange (none, or fewer than the deployment's quorum):
    the message names each dropped client and why."""


def fit_reply_problem(reply: object, sent: Message, expects: Callable[[Message], str | None] = lambda m: None,
                      ) -> str | None:
    """Why `reply` cannot be aggregated as the answer to a fit that sent `sent` (None: it can);
    `expects` is the server half's own check (`ServerHalf.reply_problem`: q-FedAvg's loss)."""
    problem = _form_problem(reply)
    if problem:
        return problem
    names, expected = set(reply.tensors), set(sent.tensors)
    if not names and not reply.scalars:
        return "an empty reply"
    if expected - names:
        return f"missing tensor {_first(expected - names)!r}"
    if names - expected:
        return f"unexpected tensor {_first(names - expected)!r}"
    for name, like in sent.tensors.items():
        problem = _tensor_problem(name, reply.tensors[name], like.dtype, tuple(like.shape))
        if problem:
            return problem
    if TRAIN_LOSS not in reply.scalars:
        return f"no {TRAIN_LOSS}"
    return _scalars_problem(reply.scalars, needs_count=True) or expects(reply)


def setup_reply_problem(reply: object, expects: Callable[[Message], str | None]) -> str | None:
    """Why a setup reply cannot be used (None: it can); `expects` is the server half's own check."""
    problem = _form_problem(reply)
    if problem:
        return problem
    if not reply.tensors and not reply.scalars:
        return "an empty reply"
    for name, tensor in sorted(reply.tensors.items()):
        if not isinstance(tensor, torch.Tensor):
            return f"tensor {name!r} is a {type(tensor).__name__}, not a tensor"
        if not tensor.is_floating_point():
            return f"tensor {name!r} is {tensor.dtype}, not floating point"
        problem = _values_problem(name, tensor)
        if problem:
            return problem
    return _scalars_problem(reply.scalars, needs_count=False) or expects(reply)


def disagreeing(replies: Mapping[ClientId, Message]) -> dict[ClientId, str]:
    """The setup replies that differ from what most clients sent, in tensor names, dtypes or
    shapes after the first dimension (a count of items: FedDG's amplitudes, one per image);
    a tie between forms cannot say which is right: every reply in it is named."""
    forms = {c: _form(m) for c, m in replies.items()}
    counts = Counter(forms.values()).most_common()
    if len(counts) < 2:
        return {}
    ahead = counts[0][0] if counts[0][1] > counts[1][1] else None
    return {c: f"its tensors {_describe(form)} differ from {'most clients' if ahead else 'another client'}'s "
               f"{_describe(ahead or forms[_other(forms, c)])}"
            for c, form in sorted(forms.items()) if form != ahead}


def skipped_reply(reply: object) -> bool:
    """A DP-SGD client's reply that it took no step (its budget is spent): not aggregated, not checked."""
    return isinstance(reply, Message) and isinstance(reply.scalars, Mapping) and bool(reply.scalars.get(DP_SKIPPED))


def split_replies(replies: Mapping[ClientId, object], problem: Callable[[ClientId, object], str | None],
                  ) -> tuple[dict[ClientId, Message], dict[ClientId, str]]:
    """(the replies with no problem, {client: its problem}), both in the replies' order."""
    valid, rejected = {}, {}
    for client, reply in replies.items():
        why = problem(client, reply)
        if why:
            rejected[client] = why
        else:
            valid[client] = reply
    return valid, rejected


def describe_rejected(rejected: Mapping[ClientId, str]) -> str:
    """'client 2: tensor 'w' holds NaN; client 5: no train_loss' (sorted by client)."""
    return "; ".join(f"client {c!r}: {why}" for c, why in sorted(rejected.items(), key=lambda item: str(item[0])))


def global_problem(message: Message) -> str | None:
    """Why a new global message must not be kept (a tensor with a NaN or infinite value)."""
    for name, tensor in message.tensors.items():
        problem = _values_problem(name, tensor)
        if problem:
            return problem
    return None


# -- the pieces -------------------------------------------------------------------------
def _form_problem(reply: object) -> str | None:
    if not isinstance(reply, Message):
        return f"a {type(reply).__name__}, not a message"
    if not isinstance(reply.tensors, Mapping) or not isinstance(reply.scalars, Mapping):
        return "a message without its tensors and scalars"
    return None


def _tensor_problem(name: str, tensor: object, dtype: torch.dtype, shape: tuple) -> str | None:
    if not isinstance(tensor, torch.Tensor):
        return f"tensor {name!r} is a {type(tensor).__name__}, not a tensor"
    if tensor.dtype != dtype:
        return f"tensor {name!r} is {tensor.dtype}, expected {dtype}"
    if tuple(tensor.shape) != shape:
        return f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}"
    return _values_problem(name, tensor)


def _values_problem(name: str, tensor: torch.Tensor) -> str | None:
    if not (tensor.is_floating_point() or tensor.is_complex()) or bool(torch.isfinite(tensor).all()):
        return None
    return f"tensor {name!r} holds {'NaN' if bool(torch.isnan(tensor).any()) else 'an infinite value'}"


def _scalars_problem(scalars: Mapping, *, needs_count: bool) -> str | None:
    if needs_count and NUM_EXAMPLES not in scalars:
        return f"no {NUM_EXAMPLES}"
    for key, value in scalars.items():
        if not isinstance(value, Real) or isinstance(value, bool):  # numpy's floats are Real; True is no count
            return f"{key} is {value!r}, not a number"
        value = float(value)
        if math.isnan(value) or (math.isinf(value) and key != DP_EPSILON):
            return f"{key} is {value}"
        if key == NUM_EXAMPLES and not (value > 0 and value == int(value)):
            return f"{NUM_EXAMPLES} is {value:g}, not a positive whole number"
        if key == DP_EPSILON and value < 0:
            return f"{DP_EPSILON} is {value:g}"
    return None


def _form(message: Message) -> tuple:
    return tuple((name, str(t.dtype), tuple(t.shape[1:])) for name, t in sorted(message.tensors.items()))


def _describe(form: tuple) -> str:
    return ", ".join(f"{name} ({dtype.removeprefix('torch.')}, n x {tuple(shape)})" for name, dtype, shape in form)


def _other(forms: Mapping[ClientId, tuple], client: ClientId) -> ClientId:
    return next(c for c in sorted(forms, key=str) if forms[c] != forms[client])


def _first(names: set[str]) -> str:
    return sorted(names)[0]
