"""Digests that say what ran: a message's (the model a server or a site holds) and the code's.

`message_digest(message)` is SHA-256 over a canonical form of the message, so the coordinator,
a site and a saved model file name one model by the same 64 hex digits wherever it was
computed: the tensors in sorted name order, each as a header line (name, dtype, shape) and
its raw bytes (row-major, on the host, in the machine's little-endian order), then the scalars
in sorted name order as JSON. It does not depend on the dicts' order, the device a tensor is
on, or its memory layout (a transposed view hashes as its contiguous copy).

`code_digest()` is SHA-256 over every `.py` and `.toml` file of the installed fedcare package
(its path inside the package and its bytes, in sorted path order), computed once per process:
it names the fedcare code that ran, not torch, Flower or the other libraries (the lineage
records fedcare's version and run.json their releases), and not a study installed from
another package (`package_digest` of that package's folder names it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path

import torch

from fedcare.algorithms.messages import Message

CODE_SUFFIXES = (".py", ".toml")


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's values as bytes: row-major, on the host (any dtype, bfloat16 included)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if sys.byteorder != "little" and flat.element_size() > 1:  # pragma: no cover - no big-endian machine here
        raise RuntimeError("message digests are defined on little-endian machines")
    return flat.view(torch.uint8).numpy().tobytes()


def message_digest(message: Message) -> str:
    """SHA-256 of the message's canonical form (see the module docstring), 64 hex digits."""
    h = hashlib.sha256()
    for name in sorted(message.tensors):
        t = message.tensors[name]
        header = json.dumps([name, str(t.dtype).removeprefix("torch."), list(t.shape)], separators=(",", ":"))
        h.update(header.encode() + b"\n")
        h.update(tensor_bytes(t))
    scalars = {k: float(v) for k, v in message.scalars.items()}
    h.update(json.dumps(scalars, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def package_digest(folder: Path) -> str:
    """SHA-256 over the `.py` and `.toml` files under `folder`: each one's relative path and bytes."""
    folder = Path(folder)
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.suffix in CODE_SUFFIXES and p.is_file()
                       and "__pycache__" not in p.parts):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


@functools.cache
def code_digest() -> str:
    """The installed fedcare package's digest (`package_digest`), once per process."""
    import fedcare

    return package_digest(Path(fedcare.__file__).parent)
