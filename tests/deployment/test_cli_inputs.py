"""`fedcare flower ...` with inputs a careless or hostile user gives (issue 35): key files of two
sites that would collide, a key that would be overwritten, a certificate validity that
overflows, `--set` on a resume, `--preflight-only` taking the name of the run it checks for.
Each is refused with one line (exit 2) before anything is written; no live Flower is needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcare.cli import app


def _refused(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and all(w in result.output for w in words), result.output


@pytest.mark.parametrize("sites, words", [
    (["a", "a.pub"], ["'a.pub'", "ends in '.pub'"]),  # site a.pub's private key would be site a's public key
    (["a", "A"], ["given twice"]),  # one file where the file system ignores case
    (["a", "a"], ["given twice"]),
])
def test_certs_refuses_sites_whose_key_files_would_collide(tmp_path, sites, words):
    args = ["flower", "certs", str(tmp_path / "certs")]
    for site in sites:
        args += ["--site", site]
    _refused(CliRunner().invoke(app, args), *words)
    assert not (tmp_path / "certs").exists()


def test_site_key_never_overwrites_a_key(tmp_path):
    """`site-key k b.pub` then `site-key k b` overwrote b.pub's private key with b's public one."""
    runner = CliRunner()
    _refused(runner.invoke(app, ["flower", "site-key", str(tmp_path / "k"), "b.pub"]), "ends in '.pub'")
    assert not (tmp_path / "k").exists()
    keys = tmp_path / "k" / "keys"
    keys.mkdir(parents=True)
    (keys / "b.pub").write_text("a key made before site names ending in .pub were refused")
    _refused(runner.invoke(app, ["flower", "site-key", str(tmp_path / "k"), "b"]), "b.pub: exists already")
    assert (keys / "b.pub").read_text().startswith("a key made before") and not (keys / "b").exists()
    assert runner.invoke(app, ["flower", "site-key", str(tmp_path / "k"), "c"]).exit_code == 0
    first = (keys / "c").read_bytes(), (keys / "c.pub").read_bytes()
    _refused(runner.invoke(app, ["flower", "site-key", str(tmp_path / "k"), "c"]), "exists already")
    assert ((keys / "c").read_bytes(), (keys / "c.pub").read_bytes()) == first


def test_exclusive_writes_never_replace_a_file(tmp_path):
    from fedcare.files import atomic_write_bytes

    atomic_write_bytes(tmp_path / "key", b"first", exclusive=True)
    with pytest.raises(FileExistsError):
        atomic_write_bytes(tmp_path / "key", b"second", exclusive=True)
    assert (tmp_path / "key").read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["key"]


@pytest.mark.parametrize("days", ["10000000", "0", "3651"])
def test_certs_refuses_a_validity_out_of_range_and_leaves_nothing(tmp_path, days):
    """--days 10000000 overflowed the date (a traceback) and left an empty folder."""
    _refused(CliRunner().invoke(app, ["flower", "certs", str(tmp_path / "certs"), "--days", days]),
             f"--days {days}: from 1 to 3650")
    assert not (tmp_path / "certs").exists()


def test_make_certificates_itself_refuses_an_overflowing_validity(tmp_path):
    from fedcare.runtime.flower.certs import make_certificates

    with pytest.raises(ValueError, match="--days 10000000"):
        make_certificates(tmp_path / "certs", ["127.0.0.1"], 10_000_000)
    assert not (tmp_path / "certs").exists()


def test_a_resume_refuses_set_instead_of_dropping_it(tmp_path):
    """A resume continues the recorded experiment: `--set` was dropped without a word."""
    partial = tmp_path / "run.partial"
    partial.mkdir()
    result = CliRunner().invoke(app, ["flower", "run", "--resume", str(partial), "--federation", "f",
                                      "--set", "train.rounds=3"])
    _refused(result, "--set train.rounds=3: a resume continues the experiment the run recorded")


def test_a_resume_refuses_preflight_only(tmp_path):
    """The check of a resume went into the run's own folder, which the resume then found taken."""
    partial = tmp_path / "run.partial"
    partial.mkdir()
    result = CliRunner().invoke(app, ["flower", "run", "--resume", str(partial), "--federation", "f",
                                      "--preflight-only"])
    _refused(result, "--preflight-only: for a new run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.partial"]


def test_a_preflight_only_check_leaves_out_to_the_run_it_checks_for(tmp_path):
    from fedcare.deployment.cli import new_out

    config = Path("sites.toml")
    assert new_out(config, tmp_path / "x", preflight_only=False) == tmp_path / "x"
    assert new_out(config, tmp_path / "x", preflight_only=True) == tmp_path / "x.preflight"
    default = new_out(config, None, preflight_only=True)
    assert default.name.startswith("sites-flower-") and default.name.endswith(".preflight") and default.is_absolute()


@pytest.mark.parametrize("address", ["0.0.0.0:99999", "0.0.0.0:0", "0.0.0.0:x", ":9092"])
def test_superlink_refuses_an_address_without_a_port(address):
    """Port 99999 was accepted and handed to Flower."""
    _refused(CliRunner().invoke(app, ["flower", "superlink", "--address", address, "--insecure", "--dry-run"]),
             "expected HOST:PORT with a port from 1 to 65535")
