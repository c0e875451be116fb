"""Small models and data for engine tests, and one client's fit on them."""

import torch
from torch import nn

from fedcare.algorithms.training import ClientData, Randomness


class TinyNet(nn.Module):
    """A conv block with BatchNorm under `features`, a dense head under `classifier`."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x):
        return self.classifier(self.features(x)).squeeze(1)


BATCHNORM_PREFIXES = ("features.1.", "classifier.2.")  # TinyNet's two BatchNorm layers
ONE_FIT = Randomness(0, "t", 1, 1)  # the randomness of fit_once's client


def tiny_model(seed: int = 0) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet()


def tiny_data(seed: int, n: int = 40, size: int = 8) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.5).float()
    x = torch.randint(0, 200, (n, 1, size, size), generator=g, dtype=torch.uint8)
    x[y == 1, :, :4] = torch.clamp(x[y == 1, :, :4].int() + 50, max=255).to(torch.uint8)  # a learnable signal
    return ClientData(x, y)


def linear_data(n: int = 24) -> ClientData:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 5, generator=g)
    return ClientData(x, (x[:, 0] > 0).float())


class Linear(nn.Module):
    """One linear layer on linear_data's 5 features: its per-example gradients are checked by hand."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(5, 1)

    def forward(self, x):
        return self.fc(x).squeeze(1)


def fit_once(algorithm, model=None, data=None, rng=ONE_FIT):
    """One client fit of `algorithm` from its server's initial message (on the tiny net and
    tiny_data(1) unless given): (model, message, state, reply, new state)."""
    model = model if model is not None else tiny_model()
    message = algorithm.server.initial_message(model)
    state = algorithm.client.init_state(model)
    reply, new_state = algorithm.client.fit(model, message, state, data or tiny_data(1), rng)
    return model, message, state, reply, new_state


def record_fits(federation):
    """Wrap the client's fit to record (incoming message, incoming state, reply, new state) per call."""
    calls = []
    client = federation.algorithm.client
    original = client.fit

    def fit(model, message, state, data, rng):
        incoming = message.clone(), {k: v.clone() for k, v in state.items()}
        reply, new_state = original(model, message, state, data, rng)
        calls.append((rng.client, rng.round, *incoming, reply.clone(), {k: v.clone() for k, v in new_state.items()}))
        return reply, new_state

    client.fit = fit
    return calls


def parameter_names(model) -> list[str]:
    return [n for n, _ in model.named_parameters()]
