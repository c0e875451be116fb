"""`[runtime]` (fedcare.config.runtime): more threads than the machine's cores are refused."""

import pytest

from fedcare.config import ConfigError
from fedcare.studies.load import load_config

from support.experiment_files import MINIMAL, write_exp


def test_more_threads_than_cores_is_refused(tmp_path):
    """`runtime.threads=100000` segfaulted (exit 139) and left run.json saying "running"."""
    import os

    with pytest.raises(ConfigError, match=rf"--set runtime.threads=100000: runtime.threads: Value error, threads = "
                                          rf"100000 is more than this machine's {os.cpu_count()} cores"):
        load_config(write_exp(tmp_path, MINIMAL), ["runtime.threads=100000"])
    assert load_config(write_exp(tmp_path, MINIMAL), [f"runtime.threads={os.cpu_count()}"]).runtime.threads == os.cpu_count()
