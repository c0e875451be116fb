"""Many clients' local training in one batched step (`torch.func`: `functional_call` under
`vmap` over stacked parameters), for the regime of many clients with small models (per-patient
heads, the HAR CNN, a thousand clients): one Python step trains K clients, where the plain
loop (`training.train_epochs`) takes K.

It is `train_epochs` for each client, to float tolerance (the batched kernels add in another
order: about 1e-8 apart after a few steps, tested within 1e-6): the same shuffles from each
client's generator, the same batches (a trailing batch of one example skipped), plain SGD
(rounded as torch.optim.SGD's step rounds it),
BatchNorm's running statistics updated per client. Clients whose batch at a step has another
size (a shorter last batch) are stepped together in their own group.

What it covers (`vectorisable` says why not): the task's own loss (not one that depends on the
client's data, such as a per-client pos_weight), SGD without momentum or weight decay, no
schedule, no gradient hook (DP-SGD), no batch transform or penalty (FedDG, FedProx, FedDyn).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedcare.algorithms.training import SGD, ClientData, TrainSettings, as_float, batches_per_epoch
from fedcare.device import device_of
from fedcare.tasks import Task


def vectorisable(settings: TrainSettings, model: nn.Module) -> str | None:
    """None if `train_stacked` reproduces `train_epochs` for `model` under these settings; else why not."""
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return "dropout (its masks come from the global generator, one client after another)"
    if settings.loss is not None or type(settings.task).batch_loss is not Task.batch_loss:
        return "a loss that depends on the client's data"
    if settings.optimizer != SGD():
        return f"optimizer {settings.optimizer!r} (plain SGD only)"
    if settings.scheduler is not None:
        return "a learning-rate schedule"
    if settings.gradient_hook is not None:
        return "a gradient hook (DP-SGD)"
    if settings.precision != "fp32":
        return f"precision {settings.precision} (fp32 only)"
    return None


def _batches(n: int, batch_size: int, epochs: int, generator: torch.Generator) -> list[torch.Tensor]:
    """The batches `train_epochs` takes, in order: one shuffle per epoch, batches of one skipped."""
    out = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator, device=generator.device)
        out += [order[s:s + batch_size] for s in range(0, n, batch_size) if len(order[s:s + batch_size]) >= 2]
    return out


def train_stacked(model: nn.Module, states: Sequence[dict[str, torch.Tensor]], data: Sequence[ClientData],
                  settings: TrainSettings, generators: Sequence[torch.Generator], *, epochs: int | None = None,
                  lr: float | None = None, trainable: set[str] | None = None,
                  common: set[str] = frozenset()) -> tuple[list[dict], list[float]]:
    """Train one copy of `model` per client: client k starts from `states[k]` (a full state
    dict), trains on `data[k]` shuffled by `generators[k]`; the parameters in `trainable`
    (default all) move, the others stay. `model`'s modules keep their train/eval modes (PFDL's
    frozen blocks are in eval mode). `common`: tensors that are the same for every client and
    do not change (PFDL's frozen shared blocks): kept once, not per client, so a frozen block
    runs as one large batch. Returns each client's state dict after training and the mean task
    loss of its last epoch, as `train_epochs` would."""
    why = vectorisable(settings, model)
    if why:
        raise ValueError(f"vectorised training does not cover {why}")
    epochs = settings.local_epochs if epochs is None else epochs
    lr = settings.lr if lr is None else lr
    names = [n for n, _ in model.named_parameters()]
    trainable = set(names) if trainable is None else set(trainable)
    if common & trainable:
        raise ValueError(f"tensors both trained and common to every client: {sorted(common & trainable)[:3]}")
    once = {k: states[0][k] for k in common}
    stacked = {k: torch.stack([s[k] for s in states]) for k in states[0] if k not in common}  # [K, ...] per tensor
    plan = [_batches(len(d), settings.batch_size, epochs, g) for d, g in zip(data, generators)]
    host, device = torch.device("cpu"), device_of(model)  # the losses are summed on the host, in fp64
    last_epoch = torch.tensor([len(p) - batches_per_epoch(len(d), settings.batch_size) for p, d in zip(plan, data)],
                              device=host)
    k_all, task = len(states), settings.task
    # every client's examples in one padded tensor: a step gathers its batches in one indexing
    x_all = torch.zeros((k_all, max(len(d) for d in data), *data[0].x.shape[1:]), dtype=data[0].x.dtype, device=device)
    y_all = torch.zeros((k_all, x_all.shape[1], *data[0].y.shape[1:]), dtype=data[0].y.dtype, device=device)
    for k, d in enumerate(data):
        x_all[k, :len(d)], y_all[k, :len(d)] = d.x[:], d.y  # [:] cuts images held as items
    loss_sum, count = torch.zeros(k_all, dtype=torch.float64, device=host), torch.zeros(k_all, dtype=torch.float64, device=host)

    def loss_of(moving, fixed, x, y):
        return task.loss(functional_call(model, {**moving, **fixed, **once}, (x,)), y)

    step = vmap(grad_and_value(loss_of))
    for s in range(max(map(len, plan), default=0)):
        groups: dict[int, list[int]] = {}  # batch size -> the clients taking a batch of it at step s
        for k, batches in enumerate(plan):
            if s < len(batches):
                groups.setdefault(len(batches[s]), []).append(k)
        for size, clients in groups.items():
            at_host = torch.tensor(clients, device=host)
            at = at_host.to(device)
            everyone = len(clients) == k_all  # the common case: no gathering of the stacked tensors
            moving = {k: stacked[k] if everyone else stacked[k][at] for k in trainable}
            # BatchNorm updates these in place (when everyone, in `stacked` itself)
            fixed = {k: v if everyone else v[at] for k, v in stacked.items() if k not in trainable}
            idx = torch.stack([plan[k][s] for k in clients]).to(device)
            x, y = as_float(x_all[at[:, None], idx]), y_all[at[:, None], idx]
            grads, losses = step(moving, fixed, x, y)
            for k in trainable:  # torch.optim.SGD's update, `add` with alpha: the same rounding as its step
                if everyone:
                    stacked[k] = torch.add(moving[k], grads[k], alpha=-lr)
                else:
                    stacked[k][at] = torch.add(moving[k], grads[k], alpha=-lr)
            if not everyone:
                for k, v in fixed.items():
                    if k not in names:  # buffers (running statistics); frozen parameters did not move
                        stacked[k][at] = v
            last = (s >= last_epoch[at_host]).double()  # the last epoch's batches give the reported loss
            loss_sum.index_add_(0, at_host, losses.to(host, torch.float64) * size * last)
            count.index_add_(0, at_host, size * last)
    trained = [{**{k: v[i].clone() for k, v in stacked.items()}, **{k: v.clone() for k, v in once.items()}}
               for i in range(len(states))]
    # as train_epochs: the last epoch's mean loss (0 when it had no batch), NaN without epochs
    means = (loss_sum / count.clamp(min=1)).tolist()
    return trained, means if epochs > 0 else [float("nan")] * k_all
