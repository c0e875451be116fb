"""The one training loop (`train_epochs`, `train_steps`) is open: it takes the loss (with the
labels), the optimizer, a learning-rate schedule and a per-step gradient hook; with the
defaults it is exactly the papers' plain SGD loop. Per-FedAvg trains with the same loss."""

import copy

import pytest
import torch

from fedcare.algorithms.perfedavg import adapt, perfedavg
from fedcare.algorithms.training import (
    SGD,
    AdamW,
    OneCycle,
    TrainingDiverged,
    TrainSettings,
    as_float,
    batches_per_epoch,
    train_epochs,
    train_steps,
)
from fedcare.tasks import BINARY

from support.tiny import tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=2)


def _plain_sgd_loop(model, data, settings, generator, momentum=0.0, schedule=None):
    """What the loop did before it was opened: torch.optim.SGD, fresh order per epoch,
    trailing batches of one example skipped."""
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=momentum)
    scheduler = schedule(optimizer) if schedule else None
    for _ in range(settings.local_epochs):
        order = torch.randperm(len(data), generator=generator)
        for start in range(0, len(data), settings.batch_size):
            idx = order[start : start + settings.batch_size]
            if len(idx) < 2:
                continue
            optimizer.zero_grad(set_to_none=True)
            BINARY.loss(model(as_float(data.x[idx])), data.y[idx]).backward()
            optimizer.step()
            if scheduler:
                scheduler.step()
    return model


def _same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_defaults_are_the_plain_sgd_loop_bit_for_bit():
    data = tiny_data(1, n=33)  # 33 = 4 batches of 8 + a trailing one, skipped
    model, expected = tiny_model(), tiny_model()
    train_epochs(model, model.parameters(), data, SETTINGS, generator=torch.Generator().manual_seed(4))
    _plain_sgd_loop(expected, data, SETTINGS, torch.Generator().manual_seed(4))
    assert _same(model, expected)
    assert batches_per_epoch(33, 8) == 4 and batches_per_epoch(34, 8) == 5


def test_the_optimizer_and_the_schedule_come_from_the_settings():
    data = tiny_data(2, n=32)
    steps = []
    one_cycle = OneCycle()

    def schedule(optimizer, n, round):
        steps.append((n, round))
        return one_cycle(optimizer, n, round)

    settings = TrainSettings(lr=0.05, batch_size=8, local_epochs=2, optimizer=SGD(momentum=0.9), scheduler=schedule)
    model, expected = tiny_model(), tiny_model()
    train_epochs(model, model.parameters(), data, settings, generator=torch.Generator().manual_seed(0))
    _plain_sgd_loop(expected, data, settings, torch.Generator().manual_seed(0), momentum=0.9,
                    schedule=lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.05], total_steps=8))
    assert steps == [(8, 1)] and _same(model, expected)  # one-cycle over the run's 2 x 4 steps, stepped per batch
    adamw = tiny_model()
    train_epochs(adamw, adamw.parameters(), data, TrainSettings(lr=0.05, batch_size=8, optimizer=AdamW()),
                 generator=torch.Generator().manual_seed(0))
    assert not _same(adamw, model)


def test_a_one_cycle_over_rounds_continues_where_the_last_round_ended():
    """Round r of a 3-round one-cycle takes the learning rates of steps (r-1)*n .. r*n-1 of one
    OneCycleLR over 3n steps: the client's rate rises and decays over the whole training."""
    def rates(schedule_for_round, rounds, steps):
        seen = []
        for rnd in range(1, rounds + 1):
            optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
            scheduler = schedule_for_round(optimizer, rnd)
            for _ in range(steps):
                seen.append(optimizer.param_groups[0]["lr"])
                optimizer.step()
                scheduler.step()
        return seen

    over_rounds = rates(lambda opt, rnd: OneCycle(rounds=3)(opt, 4, rnd), 3, 4)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    single = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=12)
    expected = []
    for _ in range(12):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        single.step()
    assert over_rounds == pytest.approx(expected, rel=1e-12)
    assert max(over_rounds) == pytest.approx(0.1, rel=0.01) and over_rounds[-1] < over_rounds[0]
    assert rates(lambda opt, rnd: OneCycle(rounds=3)(opt, 4, 7), 1, 4) == pytest.approx(expected[8:], rel=1e-12)


def test_the_gradient_hook_runs_between_backward_and_step():
    data = tiny_data(3, n=20)
    calls = []

    def freeze_everything(model, batch_size):  # what a DP-SGD hook does to gradients, taken to the extreme
        calls.append(batch_size)
        for p in model.parameters():
            p.grad.zero_()

    model = tiny_model()
    before = copy.deepcopy(model)
    train_epochs(model, model.parameters(), data, TrainSettings(lr=0.5, batch_size=8, local_epochs=1,
                                                               gradient_hook=freeze_everything),
                 generator=torch.Generator().manual_seed(0))
    assert calls == [8, 8, 4]
    weights = [n for n, _ in model.named_parameters()]
    assert all(torch.equal(model.state_dict()[n], before.state_dict()[n]) for n in weights)  # no step moved them

    def clip(model, batch_size, limit=1e-3):
        torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
        norms.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())

    norms = []
    model = tiny_model()
    train_epochs(model, model.parameters(), data, TrainSettings(lr=0.5, batch_size=8, gradient_hook=clip),
                 generator=torch.Generator().manual_seed(0))
    assert norms and max(norms) <= 1e-3 * (1 + 1e-5)


def test_the_loss_sees_the_labels_and_the_clients_data():
    data = tiny_data(4, n=16)
    seen = []

    def loss_for(client_data):
        seen.append(client_data)
        return lambda model, x, y: BINARY.loss(model(x), 1 - y)  # a loss only the labels can drive: inverted targets

    def trained(settings):
        model = tiny_model()
        train_epochs(model, model.parameters(), data, settings, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            p = torch.sigmoid(model.eval()(as_float(data.x)))
        return (p[data.y == 1].mean() - p[data.y == 0].mean()).item()  # > 0: pain scores higher

    inverted = trained(TrainSettings(lr=0.5, batch_size=8, local_epochs=20, loss=loss_for))
    plain = trained(TrainSettings(lr=0.5, batch_size=8, local_epochs=20))
    assert seen == [data]
    assert inverted < 0 < plain  # it learnt the inverted labels


def test_per_fedavg_trains_with_the_settings_loss():
    """FO-MAML on 2 f is FO-MAML on f with twice the step sizes: the loss is the settings' one."""
    data = {1: tiny_data(5, n=30)}
    doubled = TrainSettings(batch_size=8, loss=lambda d: lambda model, x, y: 2 * BINARY.loss(model(x), y))

    def global_after(settings, alpha, beta):
        from fedcare.runtime.federation import Federation

        federation = Federation(tiny_model(), perfedavg(settings, alpha=alpha, beta=beta, steps_per_round=3,
                                                        first_order=True), seed=2)
        federation.run_round("train", 1, data)
        return federation.global_message.tensors

    a, b = global_after(doubled, 0.01, 0.1), global_after(TrainSettings(batch_size=8), 0.02, 0.2)
    assert all(torch.allclose(a[k].float(), b[k].float(), atol=1e-6) for k in a)
    c = global_after(TrainSettings(batch_size=8), 0.01, 0.1)
    assert any(not torch.allclose(a[k].float(), c[k].float(), atol=1e-4) for k in a)


def test_adapt_uses_the_settings_optimizer():
    data = tiny_data(6, n=16)
    settings = TrainSettings(lr=0.05, batch_size=16, optimizer=SGD(momentum=0.9))
    model, expected = tiny_model(), tiny_model()
    adapt(model, data, settings, steps=3, generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.SGD(expected.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):  # full-batch steps: the order does not matter
        optimizer.zero_grad()
        BINARY.loss(expected(as_float(data.x)), data.y).backward()
        optimizer.step()
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(model.parameters(), expected.parameters()))


@pytest.mark.parametrize("steps", [0, -1])
def test_adapt_without_steps_leaves_the_model(steps):
    model = tiny_model()
    before = copy.deepcopy(model)
    adapt(model, tiny_data(1, n=8), SETTINGS, steps=steps, generator=torch.Generator())
    assert _same(model, before)


def test_a_clients_evaluation_runs_in_batches_of_its_eval_batch_size():
    from fedcare.algorithms.base import ClientHalf
    from fedcare.algorithms.messages import Message

    model, data = tiny_model(), tiny_data(0, n=40)
    sizes = []
    model.features.register_forward_hook(lambda module, inputs, output: sizes.append(len(inputs[0])))
    half = ClientHalf(TrainSettings(eval_batch_size=16))
    message = Message({k: v.clone() for k, v in model.state_dict().items()})
    metrics = half.evaluate(model, message, {}, data, "loss")
    assert sizes == [16, 16, 8] and metrics["n"] == 40


@pytest.mark.parametrize("driver", ["epochs", "steps"])
def test_weights_that_a_step_made_infinite_stop_training_though_the_batch_loss_was_finite(driver):
    """The loop checked only each batch's loss, computed before its step: a step that overflowed
    the weights went unnoticed until the next batch, or for ever after the last one (issue 35,
    item 13). Now the weights are checked after each epoch (and after `train_steps`)."""
    def overflow(model, batch_size):  # a gradient no learning rate survives
        for p in model.parameters():
            p.grad.fill_(3e38)

    settings = TrainSettings(lr=10.0, batch_size=40, local_epochs=1, gradient_hook=overflow)
    model, data = tiny_model(), tiny_data(1)  # one batch: its loss is the initial model's, finite
    with pytest.raises(TrainingDiverged, match="the weights after (epoch 1|local training) are not finite"):
        if driver == "epochs":
            train_epochs(model, model.parameters(), data, settings, generator=torch.Generator().manual_seed(0))
        else:
            train_steps(model, model.parameters(), data, settings, steps=1, generator=torch.Generator().manual_seed(0))


def test_a_diverged_clients_error_names_the_client():
    from fedcare.algorithms import fedavg
    from fedcare.runtime.federation import Federation

    fed = Federation(tiny_model(), fedavg(TrainSettings(lr=1e30, batch_size=8, local_epochs=1)), seed=0)
    with pytest.raises(TrainingDiverged, match=r"^training diverged: .* \(client 7\)$"):
        fed.run_round("train", 1, {7: tiny_data(7)})
