"""`fedcare lineage RUN_DIR [--verify]`: the chain of a run's aggregates and its saved models,
readable; --verify exits 2 with one line naming the first record or file that does not hold."""

import re

import pytest
from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.runfiles import read_lineage

from support.lineage import handmade_run

WIDE = {"COLUMNS": "250", "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return handmade_run(tmp_path_factory.mktemp("made") / "run")


def test_lineage_prints_every_aggregate_and_saved_model(made):
    result = CliRunner().invoke(app, ["lineage", str(made)], env=WIDE)
    assert result.exit_code == 0, result.output
    records = read_lineage(made)
    aggregates = [r for r in records if r["type"] == "aggregate"]
    for r in aggregates:  # each row: its unit, its parent and digest (12 digits), who was in it
        row = [str(r["seq"]), "/".join(map(str, r["unit"])), "fedavg", "train", str(r["round"]), r["parent"][:12],
               r["digest"][:12], r"1 \(16\), 2 \(16\), 3 \(16\)"]
        assert re.search(r"\n" + r"\s+".join(row) + r"\s*\n", result.stdout), row
    saved = {r["file"]: r for r in records if r["type"] == "model"}  # each file's last record: what it holds
    assert len(saved) == 2
    for r in saved.values():
        assert re.search(r"\s+".join([r["file"], r["digest"][:12], r["sha256"][:12]]), result.stdout)
    assert f"config: {aggregates[0]['config_sha256']}" in result.stdout and "verified" not in result.stdout
    verified = CliRunner().invoke(app, ["lineage", str(made), "--verify"], env=WIDE)
    assert verified.exit_code == 0 and "verified: 8 records, 2 model files; sealed by run.json" in verified.stdout


def test_verify_names_a_changed_model_or_record_in_one_line(made, tmp_path):
    import shutil

    run = shutil.copytree(made, tmp_path / "run")
    model = sorted((run / "models").iterdir())[1]
    data = bytearray(model.read_bytes())
    data[-3] ^= 0x10
    model.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["lineage", str(run), "--verify"], env=WIDE)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == f"error: {model}: changed since it was saved (its SHA-256 is not record 7 " \
                                    "(unit 2/fedavg/2)'s)"
    text = (run / "lineage.jsonl").read_text()
    (run / "lineage.jsonl").write_text(text.replace('"round":2', '"round":3', 1))
    result = CliRunner().invoke(app, ["lineage", str(run), "--verify"], env=WIDE)
    assert result.exit_code == 2 and "lineage.jsonl line 3 (record 2): changed since it was written" in result.stderr


def test_a_run_without_a_lineage_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["lineage", str(tmp_path)])
    assert result.exit_code == 2 and "no lineage.jsonl" in result.stderr
