"""`summarize`: a UNBC-McMaster copy as a JSON-able overview (`fedcare data summary unbc`)."""

from __future__ import annotations

from collections import Counter

from fedcare.data.unbc.files import pspi_from_facs
from fedcare.data.unbc.reader import PAIN_THRESHOLD, UnbcDataset, kind_order


def summarize(ds: UnbcDataset) -> dict:
    """A JSON-able overview: counts, per-subject sessions/frames/pain, the PSPI histogram (rounded
    integer level -> frames), and every problem with counts per kind. Pain = PSPI >= 1; pain %
    is over the frames that have a PSPI value."""
    per_subject: dict[int, dict] = {}
    histogram: Counter[int] = Counter()
    empty_facs_files = compared = mismatched = 0
    for f in ds.frames:
        s = per_subject.setdefault(f.subject, {"subject": f.subject, "sequences": {}, "frames": 0,
                                               "labelled_frames": 0, "pain_frames": 0})
        s["sequences"][f.session] = f.sequence
        s["frames"] += 1
        if f.pspi is not None:
            s["labelled_frames"] += 1
            s["pain_frames"] += f.pspi >= PAIN_THRESHOLD
            histogram[int(round(f.pspi))] += 1
        if f.facs is not None:
            empty_facs_files += not f.facs
            if f.pspi is not None:
                compared += 1
                mismatched += abs(pspi_from_facs(f.facs) - f.pspi) > 1e-6

    def percent(part: int, whole: int) -> float:
        return round(100.0 * part / whole, 2) if whole else 0.0

    subjects = []
    for number in sorted(per_subject):
        s = per_subject[number]
        names = [s["sequences"][k] for k in sorted(s["sequences"])]
        subjects.append({
            "subject": number, "sessions": len(names), "sequence_names": names, "frames": s["frames"],
            "labelled_frames": s["labelled_frames"], "pain_frames": int(s["pain_frames"]),
            "pain_percent": percent(int(s["pain_frames"]), s["labelled_frames"]),
        })
    labelled = sum(s["labelled_frames"] for s in subjects)
    pain = sum(s["pain_frames"] for s in subjects)
    counts = Counter(p.kind for p in ds.problems)
    return {
        "root": str(ds.root),
        "synthetic": ds.synthetic,
        "checked_images": ds.checked_images,
        "parts": {k: (str(v) if v is not None else None) for k, v in ds.parts.items()},
        "subjects": len(subjects),
        "sequences": sum(s["sessions"] for s in subjects),
        "frames": len(ds.frames),
        "labelled_frames": labelled,
        "pain_threshold": PAIN_THRESHOLD,
        "pain_frames": pain,
        "pain_percent": percent(pain, labelled),
        "sequences_with_labels": len(ds.sequence_labels),
        "empty_facs_files": empty_facs_files,
        "pspi_vs_facs": {"compared": compared, "mismatched": mismatched},
        "per_subject": subjects,
        "pspi_histogram": {level: histogram[level] for level in sorted(histogram)},
        "problem_counts": {k: counts[k] for k in sorted(counts, key=kind_order)},
        "problems": [{"kind": p.kind, "path": str(p.path), "detail": p.detail} for p in ds.problems],
    }
