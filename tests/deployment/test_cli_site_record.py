"""`fedcare flower site-record STATE_DIR [--lineage RUN_DIR]`: a site prints its own record
(its hash chain checked) and holds it against the coordinator's lineage: agreement, or exit 2
naming each disagreement."""

import json

from typer.testing import CliRunner

from fedcare.cli import app
from fedcare.runtime.flower.site_record import RECORD_SUFFIX
from fedcare.runtime.hashchain import ChainWriter

from support.lineage import RUN_KEY, handmade_run, truthful_site_record

WIDE = {"COLUMNS": "250", "NO_COLOR": "1"}


def test_a_sites_record_is_printed_and_agrees_with_the_lineage(tmp_path):
    run = handmade_run(tmp_path / "run")
    record = truthful_site_record(tmp_path / "state", run, "2")
    alone = CliRunner().invoke(app, ["flower", "site-record", str(tmp_path / "state")], env=WIDE)
    assert alone.exit_code == 0, alone.output
    assert f"{record} (its hash chain holds)" in alone.stdout and alone.stdout.count("  fit  ") == 4
    result = CliRunner().invoke(app, ["flower", "site-record", str(tmp_path / "state"), "--lineage", str(run)],
                                env=WIDE)
    assert result.exit_code == 0, result.output
    assert "client 2: 4 updates sent; 4 in the lineage's aggregates as sent" in result.stdout
    assert "its data are in 4 aggregates; the saved models they lead to: models/fedavg_seed1-" in result.stdout
    assert "the fedcare code the site ran: the coordinator's (same digest)" in result.stdout
    assert "the site's record and the coordinator's lineage agree" in result.stdout


def test_a_disagreement_or_a_changed_record_is_an_error(tmp_path):
    run = handmade_run(tmp_path / "run", seeds=(1,))
    path = truthful_site_record(tmp_path / "state", run, "1")
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    path.unlink()
    writer = ChainWriter(path)
    writer.append({**{k: v for k, v in e.items() if k not in ("seq", "prev", "hash")},
                   **({"sent": "f" * 64} if e["round"] == 2 else {})} for e in entries)
    writer.close()
    result = CliRunner().invoke(app, ["flower", "site-record", str(tmp_path / "state"), "--lineage", str(run)],
                                env=WIDE)
    assert result.exit_code == 2
    assert "disagrees: fit fedavg train round 2: the lineage's record 2" in result.stdout
    assert "the site's record and the coordinator's lineage disagree (2 problems)" in result.stderr
    path.write_text(path.read_text().replace('"round":1', '"round":2', 1))
    changed = CliRunner().invoke(app, ["flower", "site-record", str(tmp_path / "state")], env=WIDE)
    assert changed.exit_code == 2 and f"{path} line 1 (record 0): changed since it was written" in changed.stderr
    other = CliRunner().invoke(app, ["flower", "site-record", str(tmp_path / "state"), "--run", "ffff0000"])
    assert other.exit_code == 2 and "no site record of run ffff0000" in other.stderr
    assert RUN_KEY in str(path) and path.name.endswith(RECORD_SUFFIX)


def test_a_site_that_trained_on_nothing_has_an_empty_record_that_says_so(tmp_path):
    from fedcare.runtime.flower.site_record import SiteRecord

    run = handmade_run(tmp_path / "run", seeds=(1,))
    SiteRecord(tmp_path / "state" / f"run-{RUN_KEY}" / f"client-9{RECORD_SUFFIX}", "site-9", 9)  # greeted, no fit
    result = CliRunner().invoke(app, ["flower", "site-record", str(tmp_path / "state"), "--lineage", str(run)],
                                env=WIDE)
    assert result.exit_code == 0, result.output
    assert "client 9: 0 updates sent" in result.stdout and "its data are in 0 aggregates" in result.stdout
    assert "the saved models they lead to: none" in result.stdout
