"""A test-only fault hook at a site, for the chaos test (tests/support/chaos.py): imported by
this folder's sitecustomize.py in a site's processes when FEDCARE_TEST_FAULTS is set (JSON:
{"marks": folder, "kill": [[phase, round], ...], "corrupt": [[phase, round], ...]}). When the
site's ClientApp module is imported, its fit is wrapped so that, once per fault (a file in
`marks` says it happened, and keeps it from happening again after a restart):

- "kill": the site trains that fit, then SIGKILLs its own process group (the SuperNode, its
  launcher, the ClientApp) before it saved its state or replied: killed mid-fit;
- "corrupt": the site's reply to that fit leaves with a NaN in its first tensor (on the wire:
  the site's own state is what it computed).

Nothing of fedcare changes: the hook wraps the module's names from outside, in test processes only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import math
import os
import signal
import sys
from pathlib import Path

TARGET = "fedcare.runtime.flower.client_app"


def once(marks: Path, fault: str) -> bool:
    """True the first time `fault` is asked for (the mark file is made), False ever after."""
    try:
        with (marks / fault).open("x") as f:
            f.write(str(os.getpid()))
        return True
    except FileExistsError:
        return False


def patch(module, spec: dict) -> None:
    from fedcare.algorithms.messages import Message
    from fedcare.runtime.clients import Fit

    marks = Path(spec["marks"])
    handle, encode = module.SiteNode.handle, module.encode_results
    now: dict = {"fit": None}  # the fit of the message being handled: [phase, round]

    def faulty_handle(self, ops):
        now["fit"] = next(([op.phase, op.round] for _, op in ops if isinstance(op, Fit)), None)
        results = handle(self, ops)
        if now["fit"] in spec.get("kill", []) and once(marks, "kill-{}-{}".format(*now["fit"])):
            os.killpg(os.getpgid(0), signal.SIGKILL)
        return results

    def faulty_encode(results):
        if now["fit"] in spec.get("corrupt", []) and once(marks, "corrupt-{}-{}".format(*now["fit"])):
            reply = results[-1]
            name = sorted(n for n, t in reply.tensors.items() if t.is_floating_point())[0]
            results = [*results[:-1], Message({**reply.tensors, name: reply.tensors[name] * math.nan}, reply.scalars)]
        return encode(results)

    module.SiteNode.handle = faulty_handle
    module.encode_results = faulty_encode


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches the ClientApp module as it is imported (in whichever of the site's processes)."""

    def __init__(self, spec: dict):
        self.spec = spec

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        found = importlib.util.find_spec(name)
        run = found.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module, self.spec)

        found.loader.exec_module = exec_module
        return found


def install() -> None:
    spec = json.loads(os.environ["FEDCARE_TEST_FAULTS"])
    Path(spec["marks"]).mkdir(parents=True, exist_ok=True)
    sys.meta_path.insert(0, _AfterImport(spec))
