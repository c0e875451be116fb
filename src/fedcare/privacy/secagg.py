"""Secure aggregation (SecAgg+: Bonawitz et al. 2017; Bell et al. 2020) on fedcare's exchange:
the server learns the weighted sum of the clients' updates and nothing about any one of them.

A round with `[privacy.secure_aggregation]` takes four exchanges instead of one, in the
simulator and on Flower alike (each is an operation of `fedcare.runtime.clients`):

1. keys: each participant makes two X25519 key pairs (c: to encrypt shares in transit,
   s: to agree pairwise masks) and a self-mask seed b, and sends the public keys;
2. shares: the server forwards every public key; each client splits b and its s private key
   with Shamir's scheme (threshold t, Flower's `create_shares`: pycryptodome's Shamir) into
   one share per participant, and seals each for its holder (ChaCha20-Poly1305 under a key
   agreed with the holder's c key), so the server, which routes them, cannot read them;
3. fit: with the sealed shares addressed to it, each client trains as usual and sends only
   y = [w*x, w, n, n*loss] + PRG(b) + sum_{j>i} PRG(s_ij) - sum_{j<i} PRG(s_ij) (mod 2^62),
   x its shared tensors (fixed point, 2^-24), w its weight (its examples, or 1 when the
   server half weighs uniformly), n its examples, PRG = ChaCha20, s_ij from X25519 + HKDF;
4. unmask: the server names who sent a masked vector (survivors); each survivor opens its
   shares of every survivor's b and of every dropped client's s key, never both for one
   client. From t shares the server rebuilds them and takes the masks off the sum.

A client that drops out at any point after step 2 leaves the round able to finish as long as
t clients remain; below t the round stops with `SecAggError`. The mask cancels exactly in
integer arithmetic, so the unmasked sum does not depend on the (unseeded, secret) keys: a run
under secure aggregation gives the same numbers in every runtime, and differs from a plain run
only by the fixed-point rounding (at most 2^-25 per value and client, before the division).

The server half then averages this one sum (its `aggregate` sees a single reply of weight 1),
so only server halves whose rule needs the average alone can run under it: see
`fedcare.privacy.private_algorithm` for what is refused and why.

Trust model: an honest-but-curious server and clients (no client lies about who dropped out;
the server's list of survivors is not signed), as Flower's SecAgg+ workflow assumes. The
public parts travel through the server unauthenticated: a malicious server could substitute
keys. The DP-SGD epsilon travels in clear (it is accounting, not data).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares

from fedcare.algorithms.base import DP_EPSILON, DP_SKIPPED, NUM_EXAMPLES, TRAIN_LOSS, ClientId, DelegatingClient
from fedcare.algorithms.messages import ClientState, Message
from fedcare.errors import UserError

MOD_BITS, SCALE_BITS = 62, 24  # sums of int64 values below 2^62 never overflow
MOD = 1 << MOD_BITS
KEY_BYTES, SHARE_BYTES = 32, 52  # a 32-byte secret's Shamir share (Flower's format: 4 + 3 * 16)
SEALED_BYTES = 12 + 2 * SHARE_BYTES + 16  # nonce, the b and s-key shares, the AEAD tag

KEYS, SHARES, REVEAL = "secagg-keys", "secagg-shares", "secagg-reveal"  # the exchanges' names
WIRE = "secagg/"  # message entries of the protocol (in the fit message, besides the model)
SECRET = "extra/secagg/"  # the client's secrets for the current round, in its private state


class SecAggError(UserError, ValueError):
    """A round that cannot be unmasked (fewer clients left than the threshold), or a message
    the protocol does not accept."""


# -- primitives ----------------------------------------------------------------------------
def prg(seed: bytes, n: int) -> np.ndarray:
    """n pseudo-random integers in [0, MOD) from a 32-byte seed (ChaCha20 keystream)."""
    stream = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor().update(b"\0" * (8 * n))
    return (np.frombuffer(stream, dtype=np.uint64) % np.uint64(MOD)).astype(np.int64)


def encode(x: np.ndarray) -> np.ndarray:
    return np.round(np.asarray(x, dtype=np.float64) * (1 << SCALE_BITS)).astype(np.int64) % MOD


def decode(v: np.ndarray) -> np.ndarray:
    signed = np.where(v >= MOD // 2, v - MOD, v)
    return signed.astype(np.float64) / (1 << SCALE_BITS)


def _agree(private: X25519PrivateKey, public: bytes, purpose: bytes) -> bytes:
    peer = X25519PublicKey.from_public_bytes(public)
    return HKDF(hashes.SHA256(), 32, salt=None, info=b"fedcare-secagg-" + purpose).derive(private.exchange(peer))


def _private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def _public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _bytes(t: torch.Tensor) -> bytes:
    return t.to(torch.uint8).numpy().tobytes()


def pair_mask(s_private: bytes, s_public_other: bytes, n: int) -> np.ndarray:
    """The mask clients i and j share: the same from either side (X25519 agreement)."""
    return prg(_agree(X25519PrivateKey.from_private_bytes(s_private), s_public_other, b"mask"), n)


def masked_reply_problem(reply: Message, length: int) -> str | None:
    """Why a client's masked reply cannot enter the sum (None: it can). A reply of another
    length, type or range would corrupt every survivor's mean (a length-1 vector gave a garbage
    mean and -6e10 examples), so such a client is dropped as a dropout instead."""
    vector = reply.tensors.get("masked")
    if vector is None:
        return "no masked vector"
    if vector.dim() != 1:
        return f"a {vector.dim()}-D masked vector"
    if vector.dtype != torch.int64:
        return f"a masked vector of {vector.dtype}, not torch.int64"
    if vector.numel() != length:
        return f"a masked vector of length {vector.numel()}, not {length}"
    if bool(((vector < 0) | (vector >= MOD)).any()):
        return f"masked values outside [0, 2^{MOD.bit_length() - 1})"
    return None


def threshold_for(clients: int, fraction: float) -> int:
    """t: at least `fraction` of the round's clients, and at least 2."""
    return max(2, math.ceil(fraction * clients - 1e-9))


def _check_left(what: str, left: int, threshold: int) -> None:
    if left < threshold:
        raise SecAggError(f"secure aggregation: {left} clients left {what}, fewer than the threshold {threshold}; "
                          f"the round cannot be unmasked")


# -- the client's side ---------------------------------------------------------------------
class SecureAggClient(DelegatingClient):
    """A client half whose fit reply leaves it masked (see the module docstring); every other
    operation is the wrapped half's."""

    def exchange(self, name: str, message: Message, state: ClientState) -> tuple[Message, ClientState]:
        if name == KEYS:
            return self._keys(state)
        if name == SHARES:
            return self._shares(message, state)
        if name == REVEAL:
            return self._reveal(message, state)
        return self.inner.exchange(name, message, state)

    @staticmethod
    def _split(state: ClientState) -> tuple[ClientState, ClientState]:
        return ({k: v for k, v in state.items() if not k.startswith(SECRET)},
                {k: v for k, v in state.items() if k.startswith(SECRET)})

    @staticmethod
    def _keys(state: ClientState) -> tuple[Message, ClientState]:
        plain, _ = SecureAggClient._split(state)  # a round left unfinished before is forgotten
        c, s = X25519PrivateKey.generate(), X25519PrivateKey.generate()
        mine = {SECRET + "c_sk": _tensor(_private_bytes(c)), SECRET + "s_sk": _tensor(_private_bytes(s)),
                SECRET + "b": _tensor(secrets.token_bytes(KEY_BYTES))}
        return Message({"c_pk": _tensor(_public_bytes(c)), "s_pk": _tensor(_public_bytes(s))}), {**plain, **mine}

    @staticmethod
    def _shares(message: Message, state: ClientState) -> tuple[Message, ClientState]:
        if SECRET + "c_sk" not in state:
            raise SecAggError("secure aggregation: shares asked before keys")
        c_pk, s_pk = message.tensors["c_pk"], message.tensors["s_pk"]
        me, t, m = int(message.scalars["me"]), int(message.scalars["threshold"]), len(c_pk)
        b_shares = create_shares(_bytes(state[SECRET + "b"]), t, m)
        s_shares = create_shares(_bytes(state[SECRET + "s_sk"]), t, m)
        c_sk = X25519PrivateKey.from_private_bytes(_bytes(state[SECRET + "c_sk"]))
        sealed = torch.zeros(m, SEALED_BYTES, dtype=torch.uint8, device="cpu")
        for holder in range(m):
            key = _agree(c_sk, _bytes(c_pk[holder]), b"seal")
            nonce = secrets.token_bytes(12)
            box = ChaCha20Poly1305(key).encrypt(nonce, b_shares[holder] + s_shares[holder], _aad(me, holder))
            sealed[holder] = _tensor(nonce + box)
        kept = {SECRET + "c_pk": c_pk.clone(), SECRET + "s_pk": s_pk.clone(),
                SECRET + "me": torch.tensor(me, device="cpu"), SECRET + "threshold": torch.tensor(t, device="cpu")}
        return Message({"sealed": sealed}), {**state, **kept}

    def fit(self, model, message, state, data, rng):
        plain, secret = self._split(state)
        if SECRET + "s_pk" not in secret:
            raise SecAggError("secure aggregation: fit asked before the shares were exchanged")
        model_message = Message({k: v for k, v in message.tensors.items() if not k.startswith(WIRE)},
                                {k: v for k, v in message.scalars.items() if not k.startswith(WIRE)})
        reply, new_state = self.inner.fit(model, model_message, plain, data, rng)
        if set(reply.tensors) != set(model_message.tensors):
            raise SecAggError(f"secure aggregation: the reply's tensors {sorted(reply.tensors)} are not the global "
                              f"message's {sorted(model_message.tensors)}; the masked sum needs the same ones")
        n, loss = reply.scalars[NUM_EXAMPLES], reply.scalars[TRAIN_LOSS]
        w = n if message.scalars[WIRE + "weighted"] else 1.0
        if reply.scalars.get(DP_SKIPPED):  # DP-SGD's budget is spent: no training, weight 0 in the sum
            w, n, loss = 0.0, 0.0, 0.0
        vector = np.concatenate([(w * reply.tensors[k].double()).flatten().numpy() for k in model_message.tensors]
                                + [np.array([w, n, n * loss])])
        alive = message.tensors[WIRE + "alive"].bool()
        limit = (MOD // 2) / (1 << SCALE_BITS) / int(alive.sum())
        if not np.all(np.abs(vector) < limit):  # the sum would wrap around the ring
            raise SecAggError(f"secure aggregation: a value of this client's weighted update reaches "
                              f"{np.abs(vector).max():.3g}, beyond what the ring holds for {int(alive.sum())} clients "
                              f"({limit:.3g}); has training diverged?")
        masked = self._mask(vector, secret, alive)
        held = self._open_inbox(message.tensors[WIRE + "inbox"], secret, alive)
        scalars = {DP_EPSILON: reply.scalars[DP_EPSILON]} if DP_EPSILON in reply.scalars else {}
        return Message({"masked": torch.from_numpy(masked)}, scalars), {**new_state, **secret, **held}

    @staticmethod
    def _mask(vector: np.ndarray, secret: ClientState, alive: torch.Tensor) -> np.ndarray:
        me, n = int(secret[SECRET + "me"]), len(vector)
        y = (encode(vector) + prg(_bytes(secret[SECRET + "b"]), n)) % MOD
        s_sk, s_pk = _bytes(secret[SECRET + "s_sk"]), secret[SECRET + "s_pk"]
        for j in range(len(alive)):
            if j != me and alive[j]:
                mask = pair_mask(s_sk, _bytes(s_pk[j]), n)
                y = (y + mask) % MOD if j > me else (y - mask) % MOD
        return y

    @staticmethod
    def _open_inbox(inbox: torch.Tensor, secret: ClientState, alive: torch.Tensor) -> ClientState:
        """The shares the other clients sealed for this one, opened (the AEAD checks them)."""
        me, c_pk = int(secret[SECRET + "me"]), secret[SECRET + "c_pk"]
        c_sk = X25519PrivateKey.from_private_bytes(_bytes(secret[SECRET + "c_sk"]))
        held = torch.zeros(len(alive), 2 * SHARE_BYTES, dtype=torch.uint8, device="cpu")
        for sender in range(len(alive)):
            if alive[sender]:
                blob = _bytes(inbox[sender])
                key = _agree(c_sk, _bytes(c_pk[sender]), b"seal")
                held[sender] = _tensor(ChaCha20Poly1305(key).decrypt(blob[:12], blob[12:], _aad(sender, me)))
        return {SECRET + "held": held, SECRET + "alive": alive.to(torch.uint8)}

    @staticmethod
    def _reveal(message: Message, state: ClientState) -> tuple[Message, ClientState]:
        plain, secret = SecureAggClient._split(state)
        if SECRET + "held" not in secret:
            raise SecAggError("secure aggregation: unmasking asked before this client masked")
        alive, survivors = secret[SECRET + "alive"].bool(), message.tensors["survivors"].bool()
        if bool((survivors & ~alive).any()):
            raise SecAggError("secure aggregation: a survivor the server names never took part")
        if int(survivors.sum()) < int(secret[SECRET + "threshold"]):
            raise SecAggError("secure aggregation: fewer survivors than the threshold; refusing to reveal")
        held = secret[SECRET + "held"]
        b = torch.where(survivors[:, None], held[:, :SHARE_BYTES], 0)  # survivors: their self-mask seed
        dropped = alive & ~survivors  # dropped after the shares: their mask key, never both
        s = torch.where(dropped[:, None], held[:, SHARE_BYTES:], 0)
        return Message({"b": b, "s_sk": s}), plain  # the round is over: its secrets go


def _aad(sender: int, holder: int) -> bytes:
    return f"fedcare-secagg {sender}->{holder}".encode()


# -- the server's side ---------------------------------------------------------------------
SECURE_SUM = "secure-sum"  # the one reply the server half aggregates under secure aggregation


class SecureAggregation:
    """The server's side of the protocol: drives the four exchanges through a federation's
    clients (`fedcare.runtime.clients.Clients`) and returns the weighted mean of the
    survivors' shared tensors, as one reply (keyed `SECURE_SUM`), and the survivors."""

    def __init__(self, threshold: float):
        self.fraction = threshold
        self.rejected: dict[ClientId, str] = {}  # the last round's replies refused, and why

    def fit(self, clients, phase: str, rnd: int, work: Mapping[ClientId, tuple[Message, object]],
            weighting: str) -> tuple[dict[str, Message], list[ClientId]]:
        asked = sorted(work)
        if len(asked) < 2:
            raise SecAggError(f"secure aggregation needs at least 2 clients in a round; round {rnd} has {len(asked)}")
        t = threshold_for(len(asked), self.fraction)
        keys = clients.exchange(KEYS, rnd, {c: Message() for c in asked})
        members = [c for c in asked if c in keys]  # who takes part: index i is client members[i]
        _check_left("after the keys", len(members), t)
        c_pk = torch.stack([keys[c].tensors["c_pk"] for c in members])
        s_pk = torch.stack([keys[c].tensors["s_pk"] for c in members])
        shares = clients.exchange(SHARES, rnd, {c: Message({"c_pk": c_pk, "s_pk": s_pk}, {"me": i, "threshold": t})
                                                for i, c in enumerate(members)})
        alive = torch.tensor([c in shares for c in members], dtype=torch.uint8, device="cpu")
        _check_left("after the shares", int(alive.sum()), t)
        fit_work = {}
        for i, c in enumerate(members):
            if alive[i]:
                inbox = torch.stack([shares[s].tensors["sealed"][i] if alive[k]
                                     else torch.zeros(SEALED_BYTES, dtype=torch.uint8, device="cpu")
                                     for k, s in enumerate(members)])
                message, data = work[c]
                fit_work[c] = (Message({**message.tensors, WIRE + "inbox": inbox, WIRE + "alive": alive},
                                       {**message.scalars, WIRE + "weighted": float(weighting == "examples")}), data)
        masked = clients.fit(phase, rnd, fit_work)
        length = sum(t.numel() for name, t in work[members[0]][0].tensors.items() if not name.startswith(WIRE)) + 3
        self.rejected = {c: why for c in sorted(masked) if (why := masked_reply_problem(masked[c], length))}
        masked = {c: m for c, m in masked.items() if c not in self.rejected}  # dropped: unmasked as dropouts
        survivors = torch.tensor([bool(alive[i]) and c in masked for i, c in enumerate(members)], device="cpu")
        _check_left("after masking", int(survivors.sum()), t)
        revealed = clients.exchange(REVEAL, rnd, {c: Message({"survivors": survivors.to(torch.uint8)})
                                                  for i, c in enumerate(members) if survivors[i]})
        _check_left("to unmask", len(revealed), t)
        total = np.zeros(len(next(iter(masked.values())).tensors["masked"]), dtype=np.int64)
        for c in sorted(masked):
            total = (total + masked[c].tensors["masked"].numpy()) % MOD
        total = self._unmask(total, members, alive.bool(), survivors, revealed, s_pk, t)
        answered = [c for i, c in enumerate(members) if survivors[i]]
        epsilons = [masked[c].scalars[DP_EPSILON] for c in answered if DP_EPSILON in masked[c].scalars]
        return {SECURE_SUM: self._mean(decode(total), work[answered[0]][0], epsilons)}, answered

    @staticmethod
    def _unmask(total, members, alive, survivors, revealed, s_pk, t) -> np.ndarray:
        n = len(total)
        for i in range(len(members)):
            if not alive[i]:
                continue
            kind = "b" if survivors[i] else "s_sk"
            shares = [_bytes(revealed[c].tensors[kind][i]) for c in sorted(revealed)][:t]
            secret = combine_shares(shares)
            if survivors[i]:  # its self-mask is in the sum: take it off
                total = (total - prg(secret, n)) % MOD
            else:  # dropped after the shares: its pairwise masks stay in the survivors' vectors
                for j in range(len(members)):
                    if survivors[j]:  # survivor j added +mask if i > j, -mask if i < j
                        mask = pair_mask(secret, _bytes(s_pk[j]), n)
                        total = (total - mask) % MOD if i > j else (total + mask) % MOD
        return total

    @staticmethod
    def _mean(vector: np.ndarray, sent: Message, epsilons: list[float]) -> Message:
        """[sum w*x, sum w, sum n, sum n*loss] -> the weighted mean of x as one reply."""
        weight, n, loss = vector[-3:]
        if weight == 0:  # every survivor was out of DP-SGD budget: nothing to average, the message stays
            return Message({k: v for k, v in sent.tensors.items() if not k.startswith(WIRE)},
                           {NUM_EXAMPLES: 0.0, TRAIN_LOSS: float("nan"), **({DP_EPSILON: max(epsilons)} if epsilons else {})})
        tensors, offset = {}, 0
        for name, like in sent.tensors.items():
            if name.startswith(WIRE):
                continue
            size = like.numel()
            values = torch.from_numpy(vector[offset:offset + size] / weight).reshape(like.shape)
            tensors[name] = values.to(like.dtype) if like.is_floating_point() else values  # integers: rounded later
            offset += size
        scalars = {NUM_EXAMPLES: float(round(n)), TRAIN_LOSS: float(loss / n) if n else float("nan")}
        if epsilons:
            scalars[DP_EPSILON] = max(epsilons)
        return Message(tensors, scalars)


# -- the whole protocol in one process (the protocol's own tests) ---------------------------
def secure_sum(vectors: Mapping[int, np.ndarray], threshold: int, drop_after_masking: set[int] = frozenset(),
               ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """One round over plain vectors: every client masks with the others' keys; those in
    `drop_after_masking` vanish before their masked vector arrives. Returns (the sum of the
    survivors' vectors as the server rebuilds it, every masked vector the server received)."""
    members = sorted(vectors)
    clients, states, keys = SecureAggClient, {}, {}
    for c in members:
        keys[c], states[c] = clients._keys({})
    c_pk = torch.stack([keys[c].tensors["c_pk"] for c in members])
    s_pk = torch.stack([keys[c].tensors["s_pk"] for c in members])
    sealed = {}
    for i, c in enumerate(members):
        reply, states[c] = clients._shares(Message({"c_pk": c_pk, "s_pk": s_pk}, {"me": i, "threshold": threshold}),
                                           states[c])
        sealed[c] = reply.tensors["sealed"]
    alive = torch.ones(len(members), dtype=torch.uint8, device="cpu")
    received = {}
    for i, c in enumerate(members):
        secret = SecureAggClient._split(states[c])[1]
        states[c] = {**states[c], **SecureAggClient._open_inbox(torch.stack([sealed[s][i] for s in members]), secret,
                                                                 alive)}
        if c not in drop_after_masking:
            received[c] = SecureAggClient._mask(np.asarray(vectors[c], dtype=np.float64), secret, alive)
    survivors = torch.tensor([c in received for c in members], device="cpu")
    _check_left("after masking", int(survivors.sum()), threshold)
    revealed = {c: clients._reveal(Message({"survivors": survivors.to(torch.uint8)}), states[c])[0]
                for c in members if c in received}
    total = np.zeros(len(next(iter(vectors.values()))), dtype=np.int64)
    for y in received.values():
        total = (total + y) % MOD
    total = SecureAggregation._unmask(total, members, alive.bool(), survivors, revealed, s_pk, threshold)
    return decode(total), received
