"""Every random choice draws from a generator derived from (run seed, purpose, ...).

Seeding globally makes results depend on the order in which operations happen (FLamby#170);
deriving one generator per (run seed, client, round, purpose) makes every draw independent of
what ran before it, so the same config gives the same numbers in any runtime and order.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def derive_seed(run_seed: int, *keys: object) -> int:
    """A 63-bit seed determined only by the run seed and the keys (e.g. "order", client, round)."""
    text = "/".join([str(int(run_seed)), *(str(k) for k in keys)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def numpy_rng(run_seed: int, *keys: object) -> np.random.Generator:
    return np.random.default_rng(derive_seed(run_seed, *keys))


def torch_generator(run_seed: int, *keys: object) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(derive_seed(run_seed, *keys))
    return generator
