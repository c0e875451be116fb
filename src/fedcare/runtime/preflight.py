"""Preflight: before the first round, each site answers an aggregate summary of its data, and
the coordinator checks every summary against what the experiment needs.

At a site, `site_summary(site, min_count)` takes the site's `inventory()` (exact counts, which
never leave it) and suppresses every count from 1 to `min_count - 1` as "<k" (small-cell
suppression: no rare patient, tool or identity stands out). Zero stays zero: "no frame shows
this tool" is what the check needs, and it singles nobody out. An inventory is

    {"unit": "frames",                              # what an example is, for messages
     "splits": {"train": {"examples": 812, "videos": 3, "labels": {"Grasper": 640, ...}}, ...},
     "dataset": {"global_identities": 12}}          # facts about the copy itself, not its people

(`splits` entries: `examples`, optional group counts such as `videos` or `identities`, and
optional `labels`: examples per label name; `dataset` is never suppressed and must be the same
at every site that gives it).

At the coordinator, a summary is a site's message, not trusted: `summary_problem` checks it in
full before anything reads it (the shape `site_summary` gives, counts that can be, "<k" only
for the site's own k, labels within their split, and sizes: no field copied into run.json
unbounded). Then `check(answers, expected)` compares the summaries with the study's
`Expectations`: a required split that is missing or empty, a label the experiment does not
know (label set mismatch), a required label that never occurs (a tool no training frame
shows), dataset facts that differ between sites. Problems refuse the run before any training,
naming the site; warnings (a tool absent from a site's test frames) go to the report.

Nothing here imports Flower: the ClientApp and the ServerApp call it (`fedcare.runtime.flower`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedcare.errors import UserError

DEFAULT_MIN_COUNT = 5  # counts below this leave a site as "<5"
# What a summary may hold at most: the largest count, a site's suppression threshold, the
# length of a name, how many splits, keys per split, labels and dataset facts, and its size as
# JSON. Generous for any real site; a 10 MB field was copied into run.json before.
MAX_COUNT = 10**12
MAX_MIN_COUNT = 10**6
MAX_NAME = 100
MAX_ENTRIES = 32
MAX_LABELS = 1000
MAX_SUMMARY_BYTES = 64 * 1024


class PreflightError(UserError, RuntimeError):
    """The sites do not hold what the experiment needs; the message names each site and problem."""


@dataclass(frozen=True)
class Expectations:
    """What an experiment needs of every site's data (a study declares it)."""

    splits: tuple[str, ...] = ()  # splits that must hold examples
    labels: tuple[str, ...] = ()  # the label set the experiment knows (empty: not checked)
    required: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # split -> labels that must occur
    wanted: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # split -> labels whose absence is noted
    label_kind: str = "label"  # how messages call a label ("tool", "class")
    one_label: bool = False  # each example has exactly one label: a split's label counts add up to its examples


def suppress(count: int, min_count: int) -> int | str:
    """A count as it may leave a site: 1 .. min_count-1 become "<min_count"."""
    return f"<{min_count}" if 0 < count < min_count else int(count)


def site_summary(site: Any, min_count: int = DEFAULT_MIN_COUNT) -> dict | None:
    """The site's inventory with its small counts suppressed; None when its study gives none."""
    inventory = getattr(site, "inventory", None)
    if inventory is None:
        return None
    exact = inventory()
    splits = {}
    for name, split in exact.get("splits", {}).items():
        out = {k: suppress(v, min_count) for k, v in split.items() if k != "labels"}
        if "labels" in split:
            out["labels"] = {label: suppress(n, min_count) for label, n in split["labels"].items()}
        splits[name] = out
    return {"unit": exact.get("unit", "examples"), "min_count": min_count, "splits": splits,
            "dataset": dict(exact.get("dataset", {}))}


def occurs(count: int | str) -> bool:
    """Whether a (possibly suppressed) count is at least one: "<k" is."""
    return isinstance(count, str) or count > 0


@dataclass
class Preflight:
    """The coordinator's check of every site's summary: what run.json and the report keep."""

    sites: dict[str, dict]  # site name -> {"client": ..., "summary": the suppressed summary or None}
    problems: list[str]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict:
        return {"ok": self.ok, "sites": self.sites, "problems": self.problems, "warnings": self.warnings}

    def notes(self) -> list[str]:
        """The report's lines: each site's summary, then the warnings."""
        checked = [s for s in self.sites.values() if s["summary"] is not None]
        if not checked:
            return []
        k = max(s["summary"]["min_count"] for s in checked)
        lines = [f"Preflight: {len(checked)} sites checked their data against the experiment before the first "
                 f"round ({'no problem' if self.ok else '; '.join(self.problems)}); counts below {k} are shown as "
                 f"<{k}. " + " ".join(f"{name} ({s['client']}): {describe(s['summary'])}."
                                       for name, s in sorted(self.sites.items()) if s["summary"] is not None)]
        return lines + [f"Preflight: {w}." for w in self.warnings]


def describe(summary: Mapping[str, Any]) -> str:
    """One site's summary in a line: "train 812 frames, 3 videos (Grasper 640, Clipper <5); test ..."."""
    parts = []
    for name, split in summary["splits"].items():
        groups = ", ".join(f"{v} {k}" for k, v in split.items() if k not in ("examples", "labels"))
        labels = ", ".join(f"{k} {v}" for k, v in split.get("labels", {}).items())
        parts.append(f"{name} {split.get('examples', 0)} {summary['unit']}" + (f", {groups}" if groups else "")
                     + (f" ({labels})" if labels else ""))
    return "; ".join(parts)


def _shown(value: Any) -> str:
    """A value from a site's message, short enough for a message of ours."""
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."


def _is_int(value: Any, least: int, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most


def _count_problem(value: Any, min_count: int) -> str | None:
    """Why `value` is no count a site with suppression threshold `min_count` sends (None: it is
    one): an exact count, or "<min_count" for one from 1 to min_count - 1."""
    if _is_int(value, 0, MAX_COUNT):
        return None
    if value == f"<{min_count}" and min_count > 1:
        return None
    return f"{_shown(value)} is not a count (0 to {MAX_COUNT:g}, or '<{min_count}' below its minimum)"


def _least(count: int | str) -> int:
    return 1 if isinstance(count, str) else count  # "<k": 1 to k - 1


def _most(count: int | str, min_count: int) -> int:
    return min_count - 1 if isinstance(count, str) else count


def _name_problem(name: Any, what: str) -> str | None:
    if isinstance(name, str) and 0 < len(name) <= MAX_NAME:
        return None
    return f"{what} {_shown(name)} is not a name of 1 to {MAX_NAME} characters"


def summary_problem(summary: Any) -> str | None:
    """Why a summary read from a site's message is not one `site_summary` can give (None: it
    is). A site's message is not trusted: each field is checked before any is read, and what is
    kept (run.json, the report) is bounded."""
    if not isinstance(summary, dict):
        return "not an object"
    try:
        size = len(json.dumps(summary))
    except (TypeError, ValueError, RecursionError):
        return "not plain JSON"
    if size > MAX_SUMMARY_BYTES:
        return f"{size} bytes, more than {MAX_SUMMARY_BYTES} (a summary is a few counts)"
    extra = sorted(set(summary) - {"unit", "min_count", "splits", "dataset"})
    if extra:
        return f"unknown fields {extra[:3]}"
    min_count = summary.get("min_count")
    if not _is_int(min_count, 1, MAX_MIN_COUNT):
        return f"min_count {_shown(min_count)} is not a whole number from 1 to {MAX_MIN_COUNT}"
    problem = _name_problem(summary.get("unit"), "unit")
    if problem:
        return problem
    splits, dataset = summary.get("splits"), summary.get("dataset", {})
    if not isinstance(splits, dict) or len(splits) > MAX_ENTRIES:
        return f"splits is not an object of at most {MAX_ENTRIES} splits"
    for name, split in splits.items():
        problem = _name_problem(name, "split") or _split_problem(split, min_count)
        if problem:
            return f"split {_shown(name)}: {problem}" if isinstance(name, str) else problem
    if not isinstance(dataset, dict) or len(dataset) > MAX_ENTRIES:
        return f"dataset is not an object of at most {MAX_ENTRIES} facts"
    for fact, value in dataset.items():
        problem = _name_problem(fact, "dataset fact")
        if problem is None and not (_is_int(value, 0, MAX_COUNT) or (isinstance(value, str) and len(value) <= MAX_NAME)):
            problem = f"dataset fact {fact!r}: {_shown(value)} is not a count or a short text"
        if problem:
            return problem
    return None


def _split_problem(split: Any, min_count: int) -> str | None:
    if not isinstance(split, dict) or len(split) > MAX_ENTRIES:
        return f"not an object of at most {MAX_ENTRIES} counts"
    for key, value in split.items():
        problem = _name_problem(key, "count") or (None if key == "labels" else _count_problem(value, min_count))
        if problem:
            return problem
    examples = split.get("examples", 0)
    labels = split.get("labels", {})
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        return f"labels is not an object of at most {MAX_LABELS} labels"
    for label, count in labels.items():
        problem = _name_problem(label, "label") or _count_problem(count, min_count)
        if problem:
            return f"label {_shown(label)}: {problem}"
        if _least(count) > _most(examples, min_count):
            return f"label {label!r}: {count} examples, more than the split's {examples}"
    return None


def well_formed(summary: Any) -> bool:
    """Whether a summary read from a site's message is one `site_summary` can give
    (`summary_problem`: a malformed one is refused, not indexed into)."""
    return summary_problem(summary) is None


def check(answers: Mapping[str, tuple[Any, dict | None]], expected: Expectations) -> Preflight:
    """Check each site's summary (`answers`: site name -> (client, summary)) against `expected`."""
    problems: list[str] = []
    warnings: list[str] = []
    dataset: dict[str, dict[str, Any]] = {}  # fact -> site -> value
    for name, (client, summary) in sorted(answers.items()):
        who = f"site {name!r} ({client})"
        if summary is None:
            warnings.append(f"{who} gave no data summary (its study has none)")
            continue
        malformed = summary_problem(summary)
        if malformed:
            problems.append(f"{who} sent a malformed data summary ({malformed})")
            answers = {**answers, name: (client, None)}  # kept out of run.json and the report
            continue
        unit, splits = summary["unit"], summary["splits"]
        if expected.one_label:
            for split, counts in splits.items():
                labelled = sum(_least(n) for n in counts.get("labels", {}).values())
                if labelled > _most(counts.get("examples", 0), summary["min_count"]):
                    problems.append(f"{who}: its {split} split has {counts.get('examples', 0)} {unit} but at least "
                                    f"{labelled} labels (each has one): not counts of one copy")
        for split in expected.splits:
            if split not in splits:
                problems.append(f"{who} has no {split} split")
            elif not occurs(splits[split].get("examples", 0)):
                problems.append(f"{who}: its {split} split is empty")
        if expected.labels:
            unknown = sorted({label for s in splits.values() for label in s.get("labels", {})} - set(expected.labels))
            if unknown:
                problems.append(f"{who}: label set mismatch: it has {expected.label_kind}s {unknown} that the "
                                f"experiment does not know (it knows {list(expected.labels)})")
        for rules, found in ((expected.required, problems), (expected.wanted, warnings)):
            for split, labels in rules.items():
                counts = splits.get(split, {}).get("labels", {})
                absent = [label for label in labels if not occurs(counts.get(label, 0))]
                if absent and split in splits:
                    what = f"{expected.label_kind}{'s' if len(absent) > 1 else ''} {', '.join(map(repr, absent))}"
                    found.append(f"{who}: {what} never occur{'s' if len(absent) == 1 else ''} in its {split} {unit}")
        for fact, value in summary.get("dataset", {}).items():
            dataset.setdefault(fact, {})[name] = value
    for fact, values in sorted(dataset.items()):
        if len({repr(v) for v in values.values()}) > 1:
            problems.append(f"the sites' data differ in {fact} ({', '.join(f'{s}: {v}' for s, v in sorted(values.items()))}): "
                            f"every site must hold the same copy")
    sites = {name: {"client": client, "summary": summary} for name, (client, summary) in sorted(answers.items())}
    return Preflight(sites, problems, warnings)


def refuse(preflight: Preflight) -> None:
    """Raise `PreflightError` listing every problem, if there is one."""
    if not preflight.ok:
        raise PreflightError("preflight: the sites do not hold what the experiment needs: " + "; ".join(preflight.problems))


def check_sites(link: Any, expected: Expectations) -> Preflight:
    """`check` on the summaries of the sites a Flower `SiteLink` greeted (those that joined)."""
    return check({link.site_name(c): (c, link.preflight.get(c)) for c in sorted(link.node_of)}, expected)
