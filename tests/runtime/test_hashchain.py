"""Hash-chained JSON lines (`fedcare.runtime.hashchain`): read back as written, and any changed
byte, removed or moved line named by its line number."""

import json

import pytest

from fedcare.errors import InputError
from fedcare.runtime.hashchain import ChainError, ChainWriter, check_chain


def _write(path, n=4):
    writer = ChainWriter(path)
    size = writer.append({"type": "aggregate", "round": i, "epsilon": float("inf") if i == 2 else 1.5}
                         for i in range(n))
    writer.close()
    return size


def test_records_read_back_as_written_with_their_chain(tmp_path):
    path = tmp_path / "lineage.jsonl"
    assert _write(path) == path.stat().st_size
    records = check_chain(path)
    assert [r["round"] for r in records] == [0, 1, 2, 3] and [r["seq"] for r in records] == [0, 1, 2, 3]
    assert records[0]["prev"] == "" and all(b["prev"] == a["hash"] for a, b in zip(records, records[1:]))
    assert records[2]["epsilon"] is None  # strict JSON: an unbounded epsilon is null
    writer = ChainWriter(path)  # appending later continues the chain
    writer.append([{"type": "model"}])
    writer.close()
    assert check_chain(path)[-1]["seq"] == 4 and check_chain(path)[-1]["prev"] == records[-1]["hash"]


def test_every_changed_byte_is_named_by_its_line(tmp_path):
    path = tmp_path / "lineage.jsonl"
    _write(path, 3)
    data = path.read_bytes()
    lines = data.split(b"\n")
    second = len(lines[0]) + 1  # where line 2 starts
    for offset in range(second, second + len(lines[1])):  # each byte of line 2 in turn
        changed = bytearray(data)
        changed[offset] = ord("7") if changed[offset] != ord("7") else ord("8")
        path.write_bytes(bytes(changed))
        with pytest.raises(ChainError, match=r"lineage.jsonl line 2\b"):
            check_chain(path)


def test_a_removed_or_moved_line_breaks_the_chain(tmp_path):
    path = tmp_path / "lineage.jsonl"
    _write(path, 4)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1] + lines[2:]))
    with pytest.raises(ChainError, match="line 2 .*out of its chain"):
        check_chain(path)
    path.write_text("".join([lines[1], lines[0], *lines[2:]]))
    with pytest.raises(ChainError, match="line 1 .*out of its chain"):
        check_chain(path)


def test_a_record_rewritten_with_a_new_hash_breaks_the_next_ones_link(tmp_path):
    from fedcare.runtime.hashchain import canonical, record_hash

    path = tmp_path / "lineage.jsonl"
    _write(path, 3)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[0]["round"] = 99
    records[0]["hash"] = record_hash(records[0])  # a forger who recomputes this record's hash
    path.write_text("".join(canonical(r) + "\n" for r in records))
    with pytest.raises(ChainError, match="line 2 .*out of its chain"):
        check_chain(path)


def test_a_resume_cuts_the_file_back_and_a_crash_cut_line_is_dropped_where_asked(tmp_path):
    path = tmp_path / "lineage.jsonl"
    writer = ChainWriter(path)
    offset = writer.append([{"type": "a"}])
    writer.append([{"type": "b"}])
    writer.close()
    writer = ChainWriter(path, truncate_to=offset)
    writer.append([{"type": "c"}])
    writer.close()
    assert [r["type"] for r in check_chain(path)] == ["a", "c"]
    with pytest.raises(InputError, match="needs .*: the file was cut short"):
        ChainWriter(path, truncate_to=path.stat().st_size + 1)
    path.write_bytes(path.read_bytes() + b'{"type":"d","se')  # a crash in the middle of a line
    with pytest.raises(ChainError, match="last line is cut short"):
        check_chain(path)
    ChainWriter(path, drop_cut_line=True).close()
    assert [r["type"] for r in check_chain(path)] == ["a", "c"]


def test_a_record_may_not_set_the_chains_own_fields(tmp_path):
    writer = ChainWriter(tmp_path / "x.jsonl")
    with pytest.raises(ValueError, match="sets its own"):
        writer.append([{"seq": 5}])
    writer.close()
