"""The same experiment through Flower's own Simulation Engine (`flwr run` on a local simulation
federation, Ray running the simulated sites), started with `fedcare flower run`: its records
equal the in-process simulator's bit for bit. The local SuperLink that `flwr run` starts in
the background is stopped by the test."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fedcare.config import to_toml

from support.deployment import port as free_port
from support.pain_sites import config, records


def _processes_with(*words: str) -> list[int]:
    """Process ids whose command line holds every word (the detached local SuperLink and its children)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if all(w in cmdline for w in words):
                pids.append(int(entry.name))
    return pids


# In flwr-simulation, Flower loads the app (its ServerApp thread, and its main thread for the
# ClientApp, one after the other under Flower's import lock), then imports Ray on the main thread
# (vce_api.start_vce -> run_api -> backend_fn), whose first act is
# sys.path.insert(0, <ray>/thirdparty_files), while the ServerApp thread goes on and imports the
# study. The stand-in for Ray's thread below adds a fresh sys.path entry at every import from then
# on (any of them could be the moment Ray's insertion lands) and records the ones that vanish.
RAY_IMPORTING_MEANWHILE = """
import sys
from flwr.supercore.object_ref import load_app

load_app("fedcare.deployment.app:server_app", ValueError)
load_app("fedcare.deployment.app:client_app", ValueError)

class RayImportingMeanwhile:
    entry = during = None
    lost = []

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if cls.entry is not None:
            if cls.entry in sys.path:
                sys.path.remove(cls.entry)
            else:
                cls.lost.append(cls.during)
        cls.entry, cls.during = f"/ray/thirdparty_files/added-while-importing-{name}", name
        sys.path.insert(0, cls.entry)
        return None

sys.meta_path.insert(0, RayImportingMeanwhile)
from fedcare.studies import registry
for study in registry.BUILT_IN:
    registry.get(study)
RayImportingMeanwhile.find_spec("end")
print("dropped sys.path entries added while importing:", RayImportingMeanwhile.lost)
sys.exit(1 if RayImportingMeanwhile.lost else 0)
"""


def test_the_serverapp_threads_imports_keep_the_path_ray_adds_meanwhile():
    """The flake `ModuleNotFoundError: No module named 'colorama'` (then Exit Code 700): OpenCV's
    loader puts back a copy of sys.path taken before it ran, erasing Ray's vendored packages'
    entry when Ray's import on the main thread lands in between. Fresh interpreter: cv2 not loaded."""
    proc = subprocess.run([sys.executable, "-c", RAY_IMPORTING_MEANWHILE], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.deploy  # Ray, and the local SuperLink `flwr run` starts
@pytest.mark.timeout(900)
def test_flwr_run_on_a_local_simulation_federation_equals_the_simulator(tmp_path, pain_cohort, pain_reference):
    cohort = pain_cohort
    cfg = config(cohort, ["F(N)", "FP(N)"])
    cfg = cfg.model_copy(update={"deployment": cfg.deployment.model_copy(update={"sites": {}})})
    path = tmp_path / "sim.toml"
    path.write_text(to_toml(cfg))
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "local-simulation"\n\n'
                                      '[superlink.local-simulation]\naddress = ":local:"\n')
    port = free_port()
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_TMPDIR": ray_tmp}
    out = tmp_path / "runs" / "sim"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "fedcare.cli", "flower", "run", str(path), "--federation", "local-simulation",
             "--federation-config", "num-supernodes=3 client-resources-num-cpus=1",
             "--data-dir", str(cohort), "--state-dir", str(tmp_path / "state"), "--out", str(out)],
            env=env, capture_output=True, text=True, timeout=800, cwd=tmp_path)
    finally:
        for pid in _processes_with("flower-superlink", f"--port {port}"):
            os.kill(pid, signal.SIGTERM)  # its superexec follows its parent
        deadline = time.monotonic() + 20
        while _processes_with(str(home)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in _processes_with(str(home)) + _processes_with(ray_tmp):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert result.returncode == 0, result.stdout + result.stderr
    # the simulator's records of this experiment, bit for bit (F(N) and FP(N): conftest.py)
    assert records(out, "client_eval", "round") == pain_reference
    assert json.loads((out / "run.json").read_text())["sites"] == {"43": 43, "80": 80, "92": 92}
