"""Secure aggregation's protocol core (SecAgg+, Bonawitz et al. 2017; Bell et al. 2020),
in process: the server learns the sum of the clients' vectors and nothing about any one.

NOT YET WIRED INTO RUNS: fedcare's runtimes do not call this module (see docs/privacy.md).
It is the tested protocol a later change will put on the exchange.

Each client i (honest-but-curious server, semi-honest clients):
1. advertises an X25519 public key;
2. splits two secrets with Shamir's scheme (threshold t) among all clients, itself
   included: its self-mask seed b_i and its X25519 private key (in a deployment each share travels encrypted to its
   holder; in process it is handed over);
3. sends y_i = x_i + PRG(b_i) + sum_{j > i} PRG(s_ij) - sum_{j < i} PRG(s_ij) (mod 2^48), x_i
   in fixed point (2^-24), s_ij the X25519 shared secret through HKDF, PRG = ChaCha20;
4. once the server names who sent (survivors) and who dropped: survivors reveal their
   shares of each survivor's b and of each dropped client's private key, never both for one
   client. The server rebuilds the masks and takes them off the sum.

Shamir's scheme is written here (15 lines over the prime field 2^521 - 1): no maintained
library for it is in this environment. Masks come from `cryptography` (ChaCha20, HKDF, X25519).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

MOD_BITS, SCALE_BITS = 48, 24
MOD = 1 << MOD_BITS
PRIME = (1 << 521) - 1  # Shamir's field: a Mersenne prime above any 32-byte secret


class SecAggError(RuntimeError):
    """A round that cannot be unmasked (fewer survivors than the threshold)."""


# -- Shamir's secret sharing over GF(PRIME) ----------------------------------------------
def shamir_split(secret: int, holders: list[int], threshold: int) -> dict[int, int]:
    """Shares of `secret` for the holders (x = holder id + 1); any `threshold` rebuild it."""
    coefficients = [secret] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    return {h: sum(c * pow(h + 1, k, PRIME) for k, c in enumerate(coefficients)) % PRIME for h in holders}


def shamir_join(shares: Mapping[int, int]) -> int:
    """The secret from shares {holder: share} (Lagrange interpolation at 0)."""
    total = 0
    for h, share in shares.items():
        num, den = 1, 1
        for other in shares:
            if other != h:
                num = num * -(other + 1) % PRIME
                den = den * (h - other) % PRIME
        total = (total + share * num * pow(den, -1, PRIME)) % PRIME
    return total


# -- masks -------------------------------------------------------------------------------
def prg(seed: bytes, n: int) -> np.ndarray:
    """n pseudo-random integers in [0, MOD) from a 32-byte seed (ChaCha20 keystream)."""
    stream = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor().update(b"\0" * (8 * n))
    return (np.frombuffer(stream, dtype=np.uint64) % np.uint64(MOD)).astype(np.int64)


def pair_seed(private: X25519PrivateKey, public: X25519PublicKey) -> bytes:
    return HKDF(hashes.SHA256(), 32, salt=None, info=b"fedcare-secagg-pair").derive(private.exchange(public))


def encode(x: np.ndarray) -> np.ndarray:
    return np.round(np.asarray(x, dtype=np.float64) * (1 << SCALE_BITS)).astype(np.int64) % MOD


def decode(v: np.ndarray) -> np.ndarray:
    signed = np.where(v >= MOD // 2, v - MOD, v)
    return signed.astype(np.float64) / (1 << SCALE_BITS)


def _private_int(key: X25519PrivateKey) -> int:
    return int.from_bytes(key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()), "big")


def _private_key(value: int) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(value.to_bytes(32, "big"))


class SecAggClient:
    def __init__(self, cid: int):
        self.cid = cid
        self.key = X25519PrivateKey.generate()
        self.self_seed = secrets.token_bytes(32)
        self.held: dict[int, tuple[int, int]] = {}  # owner -> (share of its b, share of its key)

    def public_key(self) -> X25519PublicKey:
        return self.key.public_key()

    def share_secrets(self, others: list[int], threshold: int) -> dict[int, tuple[int, int]]:
        b = shamir_split(int.from_bytes(self.self_seed, "big"), others, threshold)
        k = shamir_split(_private_int(self.key), others, threshold)
        return {h: (b[h], k[h]) for h in others}

    def masked(self, x: np.ndarray, public_keys: Mapping[int, X25519PublicKey]) -> np.ndarray:
        y = (encode(x) + prg(self.self_seed, len(x))) % MOD
        for j, pk in sorted(public_keys.items()):
            if j != self.cid:
                mask = prg(pair_seed(self.key, pk), len(x))
                y = (y + mask) % MOD if j > self.cid else (y - mask) % MOD
        return y

    def reveal(self, survivors: set[int], dropped: set[int]) -> dict[int, tuple[str, int]]:
        """Shares of each survivor's self-mask seed and each dropped client's key; never both."""
        if survivors & dropped:
            raise SecAggError("a client cannot be both a survivor and dropped")
        return {owner: ("b", b) if owner in survivors else ("key", k)
                for owner, (b, k) in self.held.items() if owner in survivors | dropped}


def secure_sum(vectors: Mapping[int, np.ndarray], threshold: int, drop_after_masking: set[int] = frozenset(),
               ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """One SecAgg+ round in process: every client of `vectors` shares its secrets and masks;
    those in `drop_after_masking` vanish before their masked vector arrives. Returns (the
    sum of the survivors' vectors as the server rebuilds it, every masked vector the server
    received)."""
    clients = {c: SecAggClient(c) for c in sorted(vectors)}
    public = {c: cl.public_key() for c, cl in clients.items()}
    for c, cl in clients.items():
        for holder, share in cl.share_secrets(list(clients), threshold).items():  # itself included
            clients[holder].held[c] = share
    received = {c: clients[c].masked(vectors[c], public) for c in clients if c not in drop_after_masking}
    survivors, dropped = set(received), set(drop_after_masking)
    if len(survivors) < threshold:
        raise SecAggError(f"{len(survivors)} clients answered, fewer than the threshold {threshold}")
    revealed = {c: clients[c].reveal(survivors, dropped) for c in sorted(survivors)}
    n = len(next(iter(vectors.values())))
    total = np.zeros(n, dtype=np.int64)
    for y in received.values():
        total = (total + y) % MOD
    for owner in sorted(survivors | dropped):
        shares = {holder: r[owner][1] for holder, r in revealed.items() if owner in r}
        shares = dict(list(shares.items())[:threshold])
        if len(shares) < threshold:
            raise SecAggError(f"client {owner}: {len(shares)} shares, fewer than the threshold {threshold}")
        secret = shamir_join(shares)
        if owner in survivors:  # take its self-mask off
            total = (total - prg(secret.to_bytes(32, "big"), n)) % MOD
        else:  # a dropped client's pairwise masks with the survivors stay in their vectors: take them off
            key = _private_key(secret)
            for j in survivors:
                mask = prg(pair_seed(key, public[j]), n)
                # survivor j added +mask if owner > j, -mask if owner < j
                total = (total - mask) % MOD if owner > j else (total + mask) % MOD
    return decode(total), received

