"""Bad input as a hostile or careless user gives it: config values at and past their bounds,
site names, paths. Each is refused with exit code 2 and one line on stderr, never a traceback."""

import pytest
from typer.testing import CliRunner

from fedcare.cli import app

from support import ROOT


CONFIG = str(ROOT / "configs" / "fedhealth2" / "demo.toml")

BAD_SETTINGS = [
    "train.lr=0", "train.lr=-1", "train.lr=inf", "train.lr=nan", "train.lr=1e400", "train.lr='abc'",
    "train.rounds=0", "train.rounds=1.5", "train.rounds=-3", "train.batch_size=1", "seeds=[]", "seeds=1",
    "methods=[]", "methods=['nope']", "methods=['fedavg', 'fedavg']", "runtime.threads=0",
    "runtime.threads=100000", "runtime.device='tpu'", "runtime.precision='fp8'", "protocol.clients=1",
    "privacy.dp_sgd.noise_multiplier=-1", "privacy.dp_sgd.delta=1", "privacy.dp_sgd.max_grad_norm=inf",
    "privacy.dp_sgd.max_grad_norm=0", "privacy.client_dp.clipping_norm=nan", "deployment.round_timeout=0",
    "deployment.sites={'../x' = 1}", "title=1", "trian.lr=1", "train.round=3", "train=3", "a.b.c.d.e=1",
    "study='nope'", "nokey", "x=" + "[" * 3000 + "]" * 3000,
    # counts past their bounds: rounds = 10^30 or 2^62 allocated, then ran for ever (issue 35, item 14)
    f"train.rounds={10 ** 30}", f"train.rounds={2 ** 62}", f"train.pretrain_rounds={2 ** 62}",
    f"train.local_epochs={10 ** 30}", f"train.batch_size={10 ** 30}", f"protocol.clients={10 ** 30}",
    "data.synthetic.seconds_per_activity=1e300", "privacy.dp_sgd.noise_multiplier=1e300",
]


def _one_clean_line(result) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr


@pytest.mark.parametrize("setting", BAD_SETTINGS, ids=lambda s: s[:40])
def test_a_bad_config_value_is_one_line_and_exit_2(setting, tmp_path):
    _one_clean_line(CliRunner().invoke(app, ["run", CONFIG, "--out", str(tmp_path / "run"), "--set", setting]))
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


@pytest.mark.parametrize("path", ["", ".", "/", "/dev/null", "nope.toml", "{tmp}", "{tmp}/binary.toml",
                                  "{tmp}/bad.toml", "{tmp}/deep.toml"])
def test_a_bad_config_path_is_one_line_and_exit_2(path, tmp_path):
    (tmp_path / "binary.toml").write_bytes(b"\x00\xff\xfe binary")
    (tmp_path / "bad.toml").write_text("methods = [\n")
    (tmp_path / "deep.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    _one_clean_line(CliRunner().invoke(app, ["run", path.format(tmp=tmp_path), "--out", str(tmp_path / "run")]))


@pytest.mark.parametrize("out", ["", ".", "..", "/", "{tmp}/file/run"])
def test_a_bad_run_directory_is_one_line_and_exit_2(out, tmp_path):
    (tmp_path / "file").write_text("a file, not a folder")
    _one_clean_line(CliRunner().invoke(app, ["run", CONFIG, "--out", out.format(tmp=tmp_path)]))


@pytest.mark.parametrize("name", ["../x", "/abs", "", ".", "..", "a" * 65, "a b", "x/y", "\x00"])
def test_a_bad_site_name_is_one_line_and_exit_2(name, tmp_path):
    _one_clean_line(CliRunner().invoke(app, ["flower", "site-key", str(tmp_path / "keys"), name]))
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("args", [["resume", "nope"], ["resume", "{tmp}"], ["report", "nope"], ["report", "{tmp}"]])
def test_a_bad_run_path_is_one_line_and_exit_2(args, tmp_path):
    _one_clean_line(CliRunner().invoke(app, [a.format(tmp=tmp_path) for a in args]))
