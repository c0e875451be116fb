"""FedDG's amplitude mix of one batch: fedcare's (the chosen frames only, through the real FFT)
against the full complex FFT of the whole batch it replaced, side by side in one process, with
the largest difference between their images.

The batch is the surgical demo's: 16 frames of 3x63x112 (`--size`), a bank of 64 spectra, p
= 0.5; both draw the same frames, weights and bank entries from the same seed. Times are the
median of `--repeats` batches after 5 of warm-up, on `--threads` threads; the 1-minute load
average is printed with them.

    python benchmarks/feddg_mix.py [--batch 16] [--size 63 112] [--repeats 50] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from fedcare.algorithms.feddg import amplitude_mix, amplitude_spectrum


def full_fft_mix(x: torch.Tensor, bank: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """The mix as fedcare computed it before: every frame's full complex FFT, then the chosen kept."""
    n = len(x)
    chosen = torch.rand(n, generator=generator) < p
    lam = torch.rand(n, generator=generator).view(n, *([1] * (x.ndim - 1)))
    entries = bank[torch.randint(len(bank), (n,), generator=generator)]
    spectrum = torch.fft.fft2(x)
    mixed = torch.fft.ifft2(torch.polar((1 - lam) * spectrum.abs() + lam * entries, spectrum.angle())).real.clamp(0, 1)
    return torch.where(chosen.view(n, *([1] * (x.ndim - 1))), mixed, x)


def median_ms(mix, x: torch.Tensor, bank: torch.Tensor, repeats: int) -> float:
    generator = torch.Generator().manual_seed(0)
    times = []
    for i in range(repeats + 5):
        start = time.perf_counter()
        mix(x, bank, 0.5, generator)
        if i >= 5:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16, help="frames per batch")
    parser.add_argument("--size", type=int, nargs=2, default=[63, 112], help="frame height and width")
    parser.add_argument("--repeats", type=int, default=50, help="timed batches per implementation")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.rand(args.batch, 3, *args.size, generator=torch.Generator().manual_seed(1))
    bank = amplitude_spectrum(torch.rand(64, 3, *args.size, generator=torch.Generator().manual_seed(2)))
    differences = [float((amplitude_mix(x, bank, 0.5, torch.Generator().manual_seed(s))
                          - full_fft_mix(x, bank, 0.5, torch.Generator().manual_seed(s))).abs().max())
                   for s in range(5)]
    load = os.getloadavg()[0]
    new, old = median_ms(amplitude_mix, x, bank, args.repeats), median_ms(full_fft_mix, x, bank, args.repeats)
    print(f"batch {args.batch} x 3 x {args.size[0]} x {args.size[1]}, {args.threads} thread(s), load {load:.1f}")
    print(f"full complex FFT of the batch: {old:.2f} ms; fedcare (chosen frames, real FFT): {new:.2f} ms; "
          f"{old / new:.1f}x faster; largest image difference over 5 batches {max(differences):.1e}")


if __name__ == "__main__":
    main()
