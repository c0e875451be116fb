"""FedDG's amplitude-spectrum augmentation (Liu et al. CVPR 2021) as the surgical thesis uses
it (§4.1.6): data augmentation only, aggregation as FedAvg.

Setup exchange: each client sends the Fourier amplitude spectra |FFT2(x)| of up to
`bank_per_client` of its images (drawn with its setup generator); the server gathers them in a
bank (client order sorted) and answers each client with the bank. During training, each image
of a batch is, with probability `p`, replaced by the inverse FFT of its own phase with the
amplitude A = (1 − λ) A_own + λ A_bank, λ ~ U(0, 1), A_bank a random bank entry. The full
amplitude is interpolated (the thesis drops FedDG's low-frequency mask).

Choices where the thesis is silent (its §2.6 notes both): `p` defaults to 0.5, and a client's
bank holds only the *other* clients' amplitudes by default (the point of FedDG is to borrow
other sites' styles); `include_own=True` keeps all. Augmented images are clipped to [0, 1].
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from fedcare.algorithms.base import EXTRA, NUM_EXAMPLES, Algorithm, ClientHalf, ClientId, ServerHalf
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.split import SHARE_ALL
from fedcare.algorithms.training import ClientData, Randomness, TrainSettings, as_float, train_epochs

AMPLITUDES = "amplitudes"
BANK = EXTRA + "feddg.bank"


def amplitude_spectrum(x: torch.Tensor) -> torch.Tensor:
    return torch.fft.fft2(x).abs()


def amplitude_mix(x: torch.Tensor, bank: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Mix each image's amplitude with a random bank entry (probability p), keep its phase.

    Only the chosen images are transformed, through the real FFT: an image's spectrum is
    Hermitian-symmetric, so its first W//2 + 1 columns carry all of it (the bank's full
    spectra are cut to match) and the mix costs under a third of a full complex FFT of the
    whole batch (benchmarks/feddg_mix.py), with the same result to float rounding (tests/algorithms/test_feddg.py)."""
    if len(bank) == 0 or p <= 0:
        return x
    n, host = len(x), generator.device  # drawn on the generator's device (the CPU): the same draws on every device
    chosen = torch.rand(n, generator=generator, device=host) < p
    lam = torch.rand(n, generator=generator, device=host)
    entries = torch.randint(len(bank), (n,), generator=generator, device=host)
    picked = chosen.nonzero().squeeze(1)
    if len(picked) == 0:
        return x
    lam = lam[picked].view(-1, *([1] * (x.ndim - 1))).to(x.device)
    rows = picked.to(x.device)
    spectrum = torch.fft.rfft2(x[rows])
    half = bank[entries[picked]][..., : spectrum.shape[-1]].to(x.device)
    amplitude = (1 - lam) * spectrum.abs() + lam * half
    out = x.clone()
    out[rows] = torch.fft.irfft2(torch.polar(amplitude, spectrum.angle()), s=x.shape[-2:]).clamp(0, 1)
    return out


class FedDGClient(ClientHalf):
    batched_fit = False  # a fit of its own: not the library's to batch over clients

    def __init__(self, settings: TrainSettings, bank_per_client: int, p: float):
        super().__init__(settings, SHARE_ALL)
        self.bank_per_client = bank_per_client
        self.p = p

    def setup(self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness) -> Message:
        k = min(self.bank_per_client, len(data))
        generator = rng.torch("amplitude-bank")
        pick = torch.randperm(len(data), generator=generator, device=generator.device)[:k]
        return Message({AMPLITUDES: amplitude_spectrum(as_float(data.x[pick]))}, {NUM_EXAMPLES: float(len(data))})

    def receive_setup(self, message: Message, state: ClientState) -> ClientState:
        return {**state, BANK: message.tensors[AMPLITUDES]}

    def fit(self, model: nn.Module, message: Message, state: ClientState, data: ClientData, rng: Randomness):
        self.load(model, message, state).train()
        bank = state.get(BANK, torch.zeros(0, device="cpu"))
        loss = train_epochs(model, model.parameters(), data, self.settings, generator=rng.torch("fit-order"), round=rng.round,
                            batch_transform=lambda x, g: amplitude_mix(x, bank, self.p, g))
        reply, _ = self.outgoing(model, len(data), loss)
        return reply, state  # FedAvg shares every model tensor; the bank is the only state


class FedDGServer(ServerHalf):
    has_setup = True  # each client's amplitude spectra (its aggregation is the mean)

    def __init__(self, include_own: bool, weighting: str):
        super().__init__(SHARE_ALL, weighting)
        self.include_own = include_own

    def setup_reply_problem(self, reply: Message) -> str | None:
        """Amplitude spectra only: at least one image's, none negative (|FFT2| is not)."""
        if set(reply.tensors) != {AMPLITUDES}:
            return f"tensors {sorted(reply.tensors)}, expected only {AMPLITUDES!r}"
        amplitudes = reply.tensors[AMPLITUDES]
        if amplitudes.ndim < 3 or len(amplitudes) == 0:
            return f"{AMPLITUDES!r} has shape {tuple(amplitudes.shape)}, expected (images, ..., height, width)"
        if bool((amplitudes < 0).any()):
            return f"{AMPLITUDES!r} holds a negative amplitude"
        return None

    def setup(self, replies: Mapping[ClientId, Message]) -> dict[ClientId, Message]:
        clients = sorted(replies)
        answers = {}
        for client in clients:
            parts = [replies[c].tensors[AMPLITUDES] for c in clients if self.include_own or c != client]
            bank = torch.cat(parts) if parts else torch.zeros(0, device="cpu")  # messages are on the CPU
            answers[client] = Message({AMPLITUDES: bank})
        return answers


def feddg(settings: TrainSettings, bank_per_client: int = 64, p: float = 0.5, include_own: bool = False,
          weighting: str = "examples") -> Algorithm:
    return Algorithm("feddg", FedDGClient(settings, bank_per_client, p), FedDGServer(include_own, weighting))
