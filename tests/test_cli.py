"""The command line as a user types it."""

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fedcare.cli import app

from support import ROOT


COMMANDS = [[], ["run"], ["demo"], ["report"], ["data"], ["data", "synth"], ["data", "synth", "pain"],
            ["data", "summary"], ["data", "summary", "unbc"], ["flower"], ["flower", "supernode"],
            ["flower", "clientapps"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "fedcare")
def test_every_command_has_help(command):
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output and len(result.output.splitlines()) > 5


def test_demo_runs_end_to_end_and_prints_the_summary_and_report_path(tmp_path):
    out = tmp_path / "demo"
    shrink = ["train.rounds=1", "train.pretrain_rounds=1", "protocol.last_session=2",
              "data.synthetic.frame_scale=0.02", "protocol.image_size=16"]
    result = CliRunner().invoke(app, ["demo", "--out", str(out), *[a for s in shrink for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    for method in ["RANDOM", "BC", "C(C)", "F(C)", "FP(C)", "FL(C)"]:
        assert f"| {method} |" in result.output
    assert "Means over seeds: RANDOM over 10; BC, C(C), F(C), FP(C), FL(C) over 1." in result.output
    assert f"Report: {out.resolve() / 'report.html'}" in result.output
    run = json.loads((out / "run.json").read_text())
    assert run["synthetic"] is True and run["methods"] == ["RANDOM", "BC", "C(C)", "F(C)", "FP(C)", "FL(C)"]
    assert (out / "synthetic-data" / "fedcare-synthetic.json").is_file()

    # `fedcare report` rebuilds the report from metrics.jsonl alone
    (out / "report.html").unlink()
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0 and (out / "report.html").is_file() and "| FL(C) |" in result.output


def test_report_on_a_folder_that_is_not_a_run(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in result.output


def test_synth_then_summary(tmp_path):
    out = tmp_path / "cohort"
    result = CliRunner().invoke(app, ["data", "synth", "pain", str(out), "--subjects", "43,80", "--frame-scale", "0.02"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["data", "summary", "unbc", str(out), "--json"])
    summary = json.loads(result.stdout)
    assert summary["synthetic"] is True and summary["subjects"] == 2 and summary["problems"] == []


def _commands(command, path=()):
    """Every command of the app tree with its path of names."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _words(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


@pytest.mark.parametrize("path", [p for p, _ in _commands(typer.main.get_command(app))], ids=lambda p: " ".join(p) or "fedcare")
def test_every_arguments_and_options_help_text_is_shown_whole(path):
    """Positional arguments' help disappears with typer<0.21 on click 8.5 (pyproject.toml bounds
    both); help text with brackets is eaten as console markup unless escaped."""
    command = dict(_commands(typer.main.get_command(app)))[path]
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "2000", "NO_COLOR": "1"}, terminal_width=2000)
    assert result.exit_code == 0, result.output
    shown = _words(result.output)
    for param in command.params:
        text = getattr(param, "help", None)
        if text and not getattr(param, "hidden", False):
            assert _words(text.replace("\\[", "[")) in shown, (path, param.name)


def test_flower_commands_are_found_in_an_environment_that_was_never_activated(monkeypatch):
    """`.venv/bin/fedcare flower run` (and `.venv/bin/python -m pytest`) start `flwr`, which is
    beside the interpreter but not on the PATH of a shell that did not activate the venv."""
    import shutil
    import sysconfig

    from fedcare.deployment.cli import put_flower_commands_on_path

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert shutil.which("flower-superlink") is None
    put_flower_commands_on_path()
    assert shutil.which("flwr") == str(Path(sysconfig.get_path("scripts")) / "flwr")
    assert shutil.which("flower-superlink") is not None


@pytest.mark.parametrize("args", [["run", "nope.toml"], ["run", "nope.toml", "--set", "seeds=[1]"], ["resume", "nope"]])
def test_a_wrong_path_is_reported_before_the_training_stack_is_imported(args, tmp_path):
    """A mistyped path took 24 s on a loaded machine to report: torch was imported first."""
    import subprocess
    import sys

    code = ("import sys\nfrom typer.testing import CliRunner\nfrom fedcare.cli import app\n"
            f"r = CliRunner().invoke(app, {args!r})\n"
            "print(r.exit_code, 'torch' in sys.modules)\nprint(r.output)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    first, *rest = out.stdout.splitlines()
    assert first == "2 False", out.stdout + out.stderr
    assert "error:" in " ".join(rest)


BAD_SITE_NAMES = ["../x", "/tmp/abs", "", ".", "..", "a" * 300, "a b", "x/y"]


@pytest.mark.parametrize("name", BAD_SITE_NAMES)
def test_a_site_name_that_is_not_an_identifier_is_refused_before_anything_is_written(tmp_path, name):
    """`flower certs OUT --site ../x` wrote outside OUT; '', '.', '..' and 300 characters gave
    tracebacks, and the failed call left ca.* behind so a retry was refused."""
    runner = CliRunner()
    for args in (["flower", "certs", str(tmp_path / "certs"), "--site", "ok", "--site", name],
                 ["flower", "site-key", str(tmp_path / "sk"), name],
                 ["flower", "supernode", "--site", name, "--data-dir", str(tmp_path), "--state-dir", str(tmp_path / "st"),
                  "--insecure", "--dry-run"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "site name" in result.output and "Traceback" not in result.output, args
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, inside or outside
    assert runner.invoke(app, ["flower", "certs", str(tmp_path / "certs"), "--site", "ok"]).exit_code == 0  # a retry works


def test_a_config_refuses_a_site_name_that_is_not_an_identifier(tmp_path):
    from fedcare.config import ConfigError
    from fedcare.studies.load import load_config

    path = tmp_path / "x.toml"
    path.write_text('methods = ["F(C)"]\n[data]\nroot = "unbc"\n[deployment.sites]\n"../43" = 43\n')
    with pytest.raises(ConfigError, match=r"x.toml: deployment.sites: Value error, site name '../43': use 1 to 64"):
        load_config(path)


@pytest.mark.parametrize("out", ["", ".", "..", "/"])
def test_an_out_that_names_no_new_folder_is_one_clear_line(out, tmp_path):
    """`--out ''` printed "PosixPath('.') has an empty name"."""
    config = ROOT / "configs" / "fedhealth2" / "demo.toml"
    result = CliRunner().invoke(app, ["run", str(config), "--out", out])
    assert result.exit_code == 2 and "name a new folder for the run" in result.output and "PosixPath" not in result.output


def test_an_experiment_nested_too_deeply_is_one_clear_line(tmp_path):
    """TOML nested 5,000 deep gave a RecursionError traceback."""
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    result = CliRunner().invoke(app, ["run", str(deep)])
    assert result.exit_code == 2 and f"{deep}: nested too deeply" in result.output and "Traceback" not in result.output


def test_supernode_refuses_what_would_expose_or_break_the_site(tmp_path):
    """Port 99999, a world-readable auth key, a world-writable, read-only or file state dir
    were accepted without a word."""
    import os

    def supernode(*extra):
        base = ["flower", "supernode", "--site", "a", "--data-dir", str(tmp_path), "--dry-run"]
        return CliRunner().invoke(app, [*base, *extra])

    state = tmp_path / "state"
    key = tmp_path / "a.key"
    key.write_text("k")
    ca = tmp_path / "ca.crt"
    ca.write_text("c")
    secure = ["--root-certificates", str(ca), "--auth-key", str(key)]
    key.chmod(0o600)
    assert supernode("--state-dir", str(state), *secure).exit_code == 0
    cases = [
        (["--state-dir", str(state), "--port", "99999", "--insecure"], "--port 99999: not a port"),
        (["--state-dir", str(key), "--insecure"], "exists and is not a directory"),
    ]
    for args, said in cases:
        result = supernode(*args)
        assert result.exit_code == 2 and said in result.output, result.output
    key.chmod(0o644)
    result = supernode("--state-dir", str(state), *secure)
    assert result.exit_code == 2 and "readable by others (mode 644)" in result.output
    key.chmod(0o600)
    state.chmod(0o777)
    result = supernode("--state-dir", str(state), *secure)
    assert result.exit_code == 2 and "writable by every user" in result.output
    if os.geteuid() != 0:  # root writes anywhere
        state.chmod(0o500)
        assert "not writable" in supernode("--state-dir", str(state), "--insecure").output
    state.chmod(0o700)


def test_supernode_refuses_a_port_already_in_use(tmp_path):
    """flower-supernode logs "address already in use" and hangs; the site is told at once."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["flower", "supernode", "--site", "a", "--data-dir", str(tmp_path),
                                          "--state-dir", str(tmp_path / "state"), "--insecure", "--port", str(port)])
    assert result.exit_code == 2 and f"--port {port}: already in use on this machine" in result.output, result.output


def test_free_ports_are_drawn_below_the_ephemeral_range_and_bindable():
    import socket

    from fedcare.runtime.flower.processes import free_port, port_is_free

    ports = {free_port() for _ in range(20)}
    assert all(20000 <= p <= 32767 and port_is_free(p) for p in ports) and len(ports) > 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        assert not port_is_free(port)
        with pytest.raises(RuntimeError, match="no free TCP port"):
            free_port(port, port)


def test_flower_run_binds_sites_to_their_keys_or_says_it_does_not(tmp_path):
    """A deployed run needs the sites' public keys (or an explicit --unverified-sites); the
    supernode's key goes into its node config, where the ClientApp signs the greeting with it."""
    from fedcare.runtime.flower.certs import make_site_key

    config = str(ROOT / "src/fedcare/configs/pain/sites.toml")
    runner = CliRunner()

    def flower_run(*extra):
        return runner.invoke(app, ["flower", "run", config, "--federation", "nowhere", "--out", str(tmp_path / "r"), *extra])

    result = flower_run()
    assert result.exit_code == 2 and "--site-keys: not given" in result.output and "--unverified-sites" in result.output
    result = flower_run("--site-keys", str(tmp_path / "nokeys"))
    assert result.exit_code == 2 and "nokeys: no such directory" in result.output
    result = flower_run("--site-keys", str(tmp_path), "--unverified-sites")
    assert result.exit_code == 2 and "not with" in result.output
    assert not (tmp_path / "r").exists()

    _, public = make_site_key(tmp_path, "hospital-a")
    private = tmp_path / "keys" / "hospital-a"
    ca = tmp_path / "ca.crt"
    ca.write_text("c")
    result = runner.invoke(app, ["flower", "supernode", "--site", "hospital-a", "--data-dir", str(tmp_path),
                                 "--state-dir", str(tmp_path / "state"), "--root-certificates", str(ca),
                                 "--auth-key", str(private), "--no-warm", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f'auth-key=\\"{private.resolve()}\\"' in result.output or f'auth-key="{private.resolve()}"' in result.output
    assert public.is_file()
