"""Threads on a shared machine (`fedcare.threads`): fedcare makes OpenMP's waiting threads
sleep (OMP_WAIT_POLICY=PASSIVE) before torch is loaded, in every entry point, unless the
user chose a policy; `threads = "auto"` takes the cores other work leaves free."""

import os
import subprocess
import sys

import pytest

from fedcare.config import Runtime
from fedcare.threads import auto_threads

from support import ROOT


SRC = str(ROOT / "src")
# what an entry point imports first: the package (any `import fedcare.x`), the console script's
# module, the Flower App's components, the warm ClientApp launcher
ENTRY_MODULES = ["fedcare", "fedcare.cli", "fedcare.deployment.app", "fedcare.runtime.flower.warm"]


def _policy_seen(module: str, policy: str | None) -> tuple[str, bool]:
    """(OMP_WAIT_POLICY after importing `module` in a fresh interpreter, whether torch was
    already loaded when fedcare's package ran)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = SRC
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    code = ("import sys, importlib, fedcare; early = 'torch' in sys.modules; importlib.import_module(%r); "
            "import os; print(os.environ.get('OMP_WAIT_POLICY'), early)" % module)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    value, early = out.split()
    return value, early == "True"


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_every_entry_point_sets_a_passive_wait_policy_before_torch_loads(module):
    policy, torch_loaded_first = _policy_seen(module, None)
    assert policy == "PASSIVE"
    assert not torch_loaded_first  # libgomp reads the policy when torch loads it: fedcare's package must come first


def test_a_users_own_wait_policy_is_kept():
    assert _policy_seen("fedcare.cli", "ACTIVE")[0] == "ACTIVE"


def test_auto_threads_are_the_cores_the_load_leaves_free():
    assert auto_threads(cores=8, load=0.2) == 8
    assert auto_threads(cores=8, load=2.6) == 5  # the load is rounded to whole cores
    assert auto_threads(cores=2, load=13.0) == 1  # an oversubscribed machine: one thread
    assert auto_threads(cores=4, load=-0.0) == 4


def test_threads_auto_is_opt_in():
    assert Runtime().threads is None  # the default stays torch's choice: the numbers depend on the thread count
    assert Runtime(threads="auto").threads == "auto"
    with pytest.raises(ValueError):
        Runtime(threads=0)


def test_a_run_with_threads_auto_uses_the_free_cores(monkeypatch):
    import torch

    from fedcare.studies import rundir

    monkeypatch.setattr(rundir, "auto_threads", lambda: 1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        rundir.set_threads(type("C", (), {"runtime": Runtime(threads="auto")})())
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
