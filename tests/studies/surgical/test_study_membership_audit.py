"""`[privacy.audit]` on the surgical study (fedcare.privacy.client_audit): the loss attack on every
client of the FL methods, own and peer views, not CENT or LOT, and the membership table in the
report."""

from __future__ import annotations

from fedcare.studies.run import run_study

from support import records
from support.surgical import tiny


def test_surgical_audit_covers_the_fl_methods_not_cent_or_lot(synth, cache, tmp_path):
    config = tiny(synth, cache, methods=["fedavg", "lot", "cent"], top={"privacy": {"audit": {"max_per_set": 10}}})
    run = run_study(config, tmp_path / "run")
    got = {(r["method"], r["view"], r["client"]) for r in records(run, "membership")}
    assert got == {("fedavg", v, c) for v in ("own", "peer") for c in ("HEI1", "HEI2", "CHO1", "CHO2", "CHO3")}
    assert "its test frames, which come from other videos" in (run / "tables" / "membership.md").read_text()
