"""FedDG: the amplitude bank exchange and the amplitude-mixing augmentation."""

import torch

from fedcare.algorithms.feddg import BANK, amplitude_mix, amplitude_spectrum, feddg
from fedcare.algorithms.training import Randomness, TrainSettings
from fedcare.runtime.federation import Federation

from support.tiny import tiny_data, tiny_model


SETTINGS = TrainSettings(lr=0.05, batch_size=8, local_epochs=1)


def _images(seed, n=4, size=8):
    return torch.rand(n, 1, size, size, generator=torch.Generator().manual_seed(seed))


def test_mixing_keeps_the_phase_and_interpolates_the_amplitude():
    x, style = _images(0, n=1), _images(1, n=1)
    bank = amplitude_spectrum(style)
    g = torch.Generator().manual_seed(3)
    mixed = amplitude_mix(x, bank, p=1.0, generator=g)
    g = torch.Generator().manual_seed(3)
    torch.rand(1, generator=g)  # the same draws as inside: chosen, then lambda
    lam = torch.rand(1, generator=g).item()
    expected_amplitude = (1 - lam) * amplitude_spectrum(x) + lam * bank
    unclipped = torch.fft.ifft2(torch.polar(expected_amplitude, torch.fft.fft2(x).angle())).real
    assert torch.allclose(mixed, unclipped.clamp(0, 1), atol=1e-5)
    assert not torch.allclose(mixed, x)


def test_probability_zero_changes_nothing_and_one_changes_every_image():
    x = _images(0, n=6)
    bank = amplitude_spectrum(_images(1, n=3))
    assert torch.equal(amplitude_mix(x, bank, 0.0, torch.Generator().manual_seed(0)), x)
    mixed = amplitude_mix(x, bank, 1.0, torch.Generator().manual_seed(0))
    assert all(not torch.allclose(mixed[i], x[i]) for i in range(6))


def test_setup_builds_each_clients_bank_from_the_other_clients():
    data = {1: tiny_data(1, n=10), 2: tiny_data(2, n=10), 3: tiny_data(3, n=10)}
    federation = Federation(tiny_model(), feddg(SETTINGS, bank_per_client=4), seed=0)
    federation.run_setup("setup", data)
    for c in (1, 2, 3):
        bank = federation.states[c][BANK]
        assert bank.shape == (8, 1, 8, 8)  # 4 spectra from each of the 2 other clients
    own = amplitude_spectrum(data[1].x.float() / 255)
    assert not any(torch.allclose(entry, o) for entry in federation.states[1][BANK] for o in own)

    with_own = Federation(tiny_model(), feddg(SETTINGS, bank_per_client=4, include_own=True), seed=0)
    with_own.run_setup("setup", data)
    assert with_own.states[1][BANK].shape[0] == 12


def test_bank_stays_on_the_client_and_messages_hold_the_model_only():
    data = {1: tiny_data(1, n=10), 2: tiny_data(2, n=10)}
    federation = Federation(tiny_model(), feddg(SETTINGS), seed=0)
    federation.run_setup("setup", data)
    algorithm = federation.algorithm
    reply, state = algorithm.client.fit(federation.model, federation.message_for(1), federation.states[1], data[1],
                                        Randomness(0, "p", 1, 1))
    assert set(reply.tensors) == set(federation.model.state_dict())
    assert BANK in state
    federation.run_round("p", 1, data)  # the augmentation runs inside a real round
    assert BANK in federation.states[2]


def test_mixing_a_batch_equals_the_full_complex_fft_image_by_image():
    # amplitude_mix works on the real FFT of the chosen images only; each image must come out
    # as the full complex FFT's mix would make it (odd and even widths, some images unchosen).
    for height, width in ((7, 12), (9, 11)):
        x = torch.rand(10, 3, height, width, generator=torch.Generator().manual_seed(height))
        bank = amplitude_spectrum(torch.rand(5, 3, height, width, generator=torch.Generator().manual_seed(99)))
        g = torch.Generator().manual_seed(4)
        mixed = amplitude_mix(x, bank, 0.5, g)
        g = torch.Generator().manual_seed(4)
        chosen = torch.rand(10, generator=g) < 0.5
        lam = torch.rand(10, generator=g)
        entries = torch.randint(5, (10,), generator=g)
        assert 0 < int(chosen.sum()) < 10
        for i in range(10):
            if not chosen[i]:
                assert torch.equal(mixed[i], x[i])
                continue
            spectrum = torch.fft.fft2(x[i])
            amplitude = (1 - lam[i]) * spectrum.abs() + lam[i] * bank[entries[i]]
            expected = torch.fft.ifft2(torch.polar(amplitude, spectrum.angle())).real.clamp(0, 1)
            assert torch.allclose(mixed[i], expected, atol=1e-5)


def test_an_honest_clients_amplitudes_pass_the_servers_check_and_negative_ones_do_not():
    from fedcare.algorithms.feddg import AMPLITUDES
    from fedcare.algorithms.messages import Message

    algo = feddg(SETTINGS, bank_per_client=3)
    model = tiny_model()
    message = algo.server.initial_message(model)
    reply = algo.client.setup(model, message, algo.client.init_state(model), tiny_data(1), Randomness(0, "s", 1, 0))
    assert algo.server.setup_reply_problem(reply) is None
    assert algo.server.setup_reply_problem(Message({AMPLITUDES: -reply.tensors[AMPLITUDES]})) == (
        f"{AMPLITUDES!r} holds a negative amplitude")
    assert "expected only" in algo.server.setup_reply_problem(Message({"other": reply.tensors[AMPLITUDES]}))
