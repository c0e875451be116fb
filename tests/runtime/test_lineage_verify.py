"""Checking a run's lineage (`fedcare.runtime.lineage_verify`, `fedcare lineage --verify`): it
holds on the run as written, and a changed byte in a saved model or a lineage record, a record
cut from the end, an aggregate that descends from no model of its federation, an edited
config.toml or a stray model file is named."""

import hashlib
import json
import shutil

import pytest

from fedcare.runtime.hashchain import ChainError, canonical, record_hash
from fedcare.runtime.lineage_verify import LineageError, verify_lineage

from support.lineage import handmade_run


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A finished run's lineage: two federations of two rounds, one unit a round, sealed in run.json."""
    return handmade_run(tmp_path_factory.mktemp("made") / "run")


@pytest.fixture
def run(made, tmp_path):
    return shutil.copytree(made, tmp_path / "run")


def _records(run):
    return [json.loads(line) for line in (run / "lineage.jsonl").read_text().splitlines()]


def _rewrite(run, records):
    """Write records back with their chain recomputed: a forger who rehashes everything."""
    prev = ""
    for seq, r in enumerate(records):
        r.update(seq=seq, prev=prev)
        r["hash"] = record_hash(r)
        prev = r["hash"]
    (run / "lineage.jsonl").write_text("".join(canonical(r) + "\n" for r in records))
    info = json.loads((run / "run.json").read_text())
    info["lineage"].update(records=len(records), head=prev)
    (run / "run.json").write_text(json.dumps(info))


def test_the_lineage_as_written_holds(run):
    verified = verify_lineage(run)
    assert len(verified.records) == 8 and verified.sealed
    assert sorted(verified.models) == sorted(p.relative_to(run).as_posix() for p in (run / "models").iterdir())
    assert len(verified.models) == 2


@pytest.mark.parametrize("where", ["tensor data", "header"])
def test_a_changed_byte_in_a_saved_model_is_named(run, where):
    model = sorted((run / "models").iterdir())[0]
    data = bytearray(model.read_bytes())
    header = int.from_bytes(data[:8], "little")
    at = 8 + header + 5 if where == "tensor data" else 8 + header // 2
    data[at] ^= 0x01
    model.write_bytes(bytes(data))
    with pytest.raises(LineageError, match=rf"{model.name}: (changed since it was saved|not a readable model file)"):
        verify_lineage(run)


def test_a_model_file_rewritten_with_another_model_is_named_even_without_the_sha256(run):
    """A forger who also updates the record's sha256: the file's model is still not the digest."""
    records = _records(run)
    first, second = sorted((run / "models").iterdir())
    first.write_bytes(second.read_bytes())
    for r in records:
        if r["type"] == "model" and r["file"].endswith(first.name):
            r["sha256"] = hashlib.sha256(first.read_bytes()).hexdigest()
    _rewrite(run, records)
    with pytest.raises(LineageError, match=rf"{first.name}: its model is not the one record \d+"):
        verify_lineage(run)


@pytest.mark.parametrize("field", ["examples", "digest"])
def test_a_changed_lineage_record_is_named(run, field):
    text = (run / "lineage.jsonl").read_text()
    lines = text.splitlines(keepends=True)
    if field == "examples":
        lines[2] = lines[2].replace('"examples":16', '"examples":17', 1)
    else:
        record = json.loads(lines[2])
        lines[2] = lines[2].replace(record["digest"], record["digest"][:-1] + ("0" if record["digest"][-1] != "0" else "1"))
    assert "".join(lines) != text
    (run / "lineage.jsonl").write_text("".join(lines))
    with pytest.raises(ChainError, match=r"lineage.jsonl line 3 \(record 2\): changed since it was written"):
        verify_lineage(run)


def test_records_cut_from_the_end_are_named_by_the_seal(run):
    lines = (run / "lineage.jsonl").read_text().splitlines(keepends=True)
    (run / "lineage.jsonl").write_text("".join(lines[:-2]))
    with pytest.raises(LineageError, match="6 records, but run.json sealed 8"):
        verify_lineage(run)


def test_an_aggregate_that_descends_from_no_model_of_its_federation_is_named(run):
    records = _records(run)
    records[2]["parent"] = "0" * 64  # round 2 of the first federation, from a model that never was
    _rewrite(run, records)
    with pytest.raises(LineageError, match=r"record 2 \(unit 1/fedavg/2: fedavg train round 2\): its parent 000000000000"):
        verify_lineage(run)


def test_an_edited_config_a_stray_or_missing_model_and_an_unsealed_finish_are_named(run):
    (run / "config.toml").write_text('study = "y"\n')
    with pytest.raises(LineageError, match="config_sha256 is not config.toml's"):
        verify_lineage(run)
    (run / "config.toml").write_text('study = "x"\n')
    (run / "models" / "extra.safetensors").write_bytes(b"")
    with pytest.raises(LineageError, match="extra.safetensors: a file no lineage record names"):
        verify_lineage(run)
    (run / "models" / "extra.safetensors").unlink()
    model = sorted((run / "models").iterdir())[0]
    model.unlink()
    with pytest.raises(LineageError, match=f"{model.name}: missing"):
        verify_lineage(run)
    assert len(verify_lineage(run, models=False).records) == 8  # a site holds the records only
    (run / "run.json").write_text(json.dumps({"status": "finished"}))
    with pytest.raises(LineageError, match="a finished run without its lineage seal"):
        verify_lineage(run, models=False)
    (run / "run.json").write_text(json.dumps({"status": "running"}))
    assert not verify_lineage(run, models=False).sealed  # unfinished: nothing sealed yet
    (run / "lineage.jsonl").unlink()
    with pytest.raises(LineageError, match="no lineage.jsonl"):
        verify_lineage(run)
