"""docs/deploy.md's trial on one machine runs as written: its bash block, taken out of the doc,
with its folder and ports swapped for this test's (a certificate authority and three site keys,
a SuperLink, three SuperNodes on their own synthetic copies, `fedcare flower run`, then
`fedcare run` on one copy of the three subjects): the deployed per-site metrics equal the
simulator's bit for bit, and once the doc's last line has stopped the jobs nothing of theirs
is left running (the SuperNodes' warm launchers end with them)."""

import os
import re
import subprocess
import sys
import time

import pytest

from support import ROOT
from support.deployment import port
from support.site_processes import alive_in_group, describe, wait_until

pytestmark = pytest.mark.deploy  # a real SuperLink and SuperNodes

PORTS = ("9092", "9094", "9095", "9096")  # the doc's SuperLink and the sites' local APIs


def trial_script() -> str:
    """The fenced bash block of docs/deploy.md's "A trial on one machine"."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    section = doc.split("\n## A trial on one machine\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return block


@pytest.mark.timeout(1800)
def test_the_docs_trial_runs_as_written(tmp_path):
    script = trial_script()
    assert script.startswith("T=/tmp/fedcare-trial\n") and all(p in script for p in PORTS)
    script = script.replace("T=/tmp/fedcare-trial", f"T={tmp_path / 'trial'}", 1)
    for doc_port in PORTS:
        script = re.sub(rf"\b{doc_port}\b", str(port()), script)
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]),
           "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    trial = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = trial.communicate(timeout=1500)
        assert "the same numbers" in output, output[-6000:]
        assert (tmp_path / "trial" / "runs" / "deployed" / "report.html").is_file()
        # the doc's `kill $(jobs -p)` stopped the SuperLink and the SuperNodes: nothing is left
        assert wait_until(lambda: alive_in_group(trial.pid) == [], 60), describe(alive_in_group(trial.pid))
    finally:
        try:
            os.killpg(trial.pid, 9)
        except ProcessLookupError:
            pass
        time.sleep(0.1)
