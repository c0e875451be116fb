"""The self-contained report.html of a run: one page, inline CSS, plots as base64 PNG data URIs,
tables as HTML tables. Every piece of text that comes from the run (run.json, records) is
HTML-escaped.

The page skeleton (:func:`render_page`: head, CSS, title, synthetic banner, footer), the page of
a run (:func:`render_run_page`: navigation, run facts, notes, the study's sections, plots) and
the building blocks (:func:`facts_table`, :func:`notes_html`, :func:`nav_html`,
:func:`table_block`, :func:`figure_block`) are shared by every study's report."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from fedcare.compute import describe as describe_compute
from fedcare.report.tables import Table

SYNTHETIC_BANNER = "SYNTHETIC DATA — these numbers say nothing about real patients"

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1d1d1f;
       background: #fafafa; line-height: 1.45; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 1.6em; margin: 0.2em 0 0.4em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 1.02em; margin: 1.4em 0 0.4em; }
.banner { padding: 14px 18px; margin: 12px 0 18px; font-weight: 700; font-size: 1.15em; border-radius: 6px; }
.banner.synthetic { background: #ffd60a; color: #b00020; border: 3px solid #d00000; text-transform: none; }
.banner.unknown { background: #eee; color: #444; border: 1px solid #bbb; font-weight: 600; font-size: 1em; }
.banner.incomplete { background: #ffe5d0; color: #7a2e00; border: 3px solid #e8590c; }
.banner.unsound { background: #d00000; color: #fff; border: 3px solid #7a0000; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; margin: 6px 0; font-size: 0.9em; background: #fff; }
th, td { border: 1px solid #d8d8d8; padding: 4px 8px; text-align: right; white-space: nowrap; }
thead th { background: #f0f0f3; }
tbody th { text-align: left; font-weight: 600; }
td.na { color: #999; }
table.facts th { text-align: left; background: #f0f0f3; }
table.facts td { text-align: left; white-space: normal; }
.caption { color: #555; font-size: 0.85em; margin: 2px 0 10px; max-width: 980px; }
figure { margin: 14px 0 22px; }
figure img { max-width: 100%; border: 1px solid #e2e2e2; background: #fff; }
figcaption { color: #555; font-size: 0.85em; }
nav a { margin-right: 14px; }
.notes li { margin: 2px 0; }
footer { color: #777; font-size: 0.8em; margin-top: 36px; }
"""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _list_text(x: Any) -> str:
    if isinstance(x, (list, tuple)):
        return ", ".join(str(v) for v in x)
    return str(x)


def _duration(started: Any, finished: Any) -> str | None:
    try:
        a, b = datetime.fromisoformat(str(started)), datetime.fromisoformat(str(finished))
        seconds = (b - a).total_seconds()
    except (TypeError, ValueError):
        return None
    if seconds < 0:
        return None
    h, rest = divmod(int(round(seconds)), 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


# missed operations and refused nodes (Flower runs) and a resume on other arithmetic are told in the notes;
# the run directory's own name is the table's first row
NOT_FACTS = {"title", "synthetic", "notes", "missed", "refused", "participation", "incomplete_sites", "flower_run",
             "compute_changes", "version_changes", "run_dir", "privacy_audit"}
# labels of run.json keys every study writes (a study's known_facts put its own first)
FACT_LABELS = {
    "study": "Study", "config_file": "Config file", "seeds": "Seeds", "methods": "Methods", "status": "Status",
    "started": "Started", "finished": "Finished", "training_seconds": "Training time (s)",
    "fedcare_version": "fedcare version",
}


def fact_label(key: str) -> str:
    """A run.json key as a table label: its known label, else its words (`dataset_size` -> "Dataset size")."""
    return FACT_LABELS.get(key) or key.replace("_", " ").capitalize()


def facts_table(
    run_info: Mapping[str, Any],
    run_dir_name: str,
    known_facts: Sequence[tuple[str, str]],
    extra_rows: Sequence[tuple[str, str]] = (),
) -> str:
    """The "Run" facts table: the run directory, the ``known_facts`` of run.json in that order
    (with their labels), whether the data are synthetic, every other simple run.json value, then
    ``extra_rows`` (study-specific counts). All text is escaped. The run directory is named as
    run.json names it (a report written just before the run finished is in `<out>.partial`)."""
    known = dict(known_facts)
    rows: list[tuple[str, str]] = [("Run directory", str(run_info.get("run_dir") or run_dir_name))]
    for key, label in known_facts:
        if key in run_info and run_info[key] not in (None, "", []):
            rows.append((label, _list_text(run_info[key])))
            if key == "finished":
                d = _duration(run_info.get("started"), run_info.get("finished"))
                if d:
                    rows.append(("Wall time", d))
    synthetic = run_info.get("synthetic")
    rows.append(("Data", "synthetic" if synthetic is True else "real" if synthetic is False else "not stated"))
    if isinstance(run_info.get("compute"), Mapping):  # what the numbers depend on besides the config
        rows.append(("Compute", describe_compute(run_info["compute"])))
    tracked = run_info.get("mlflow")
    if isinstance(tracked, Mapping) and tracked.get("run_id"):  # [tracking]: where MLflow has the run
        rows.append(("MLflow run", f"{tracked['run_id']} at {tracked.get('uri', '?')}"))
    for key, value in run_info.items():
        if key in NOT_FACTS or key in known:
            continue
        if isinstance(value, (str, int, float, bool, list, tuple)) and value not in ("", []):
            rows.append((fact_label(key), _list_text(value)))
    rows += list(extra_rows)
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="facts"><tbody>{body}</tbody></table>'


def table_block(t: Table) -> str:
    """A table with its title (an <h3> anchored at the table's name) and caption."""
    return f'<h3 id="{esc(t.name)}">{esc(t.title)}</h3>{t.html()}<p class="caption">{esc(t.caption)}</p>'


def figure_block(name: str, png: bytes, caption: str) -> str:
    """A plot as an inline base64 PNG with its caption and file name (plots/<name>.png)."""
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure id="plot-{esc(name)}"><img alt="{esc(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(caption)} (plots/{esc(name)}.png)</figcaption></figure>")


def nav_html(links: Sequence[tuple[str, str]]) -> str:
    """The page's navigation bar: (anchor id, label) pairs."""
    return "<nav>" + "".join(f'<a href="#{esc(a)}">{esc(label)}</a>' for a, label in links) + "</nav>"


def banner_html(synthetic: Any) -> str | None:
    """The big SYNTHETIC banner when run.json says synthetic, a grey note when it does not say,
    nothing for real data."""
    if synthetic is True:
        return f'<div class="banner synthetic" role="alert">{esc(SYNTHETIC_BANNER)}</div>'
    if synthetic is None:
        return '<div class="banner unknown">run.json does not say whether these data are synthetic or real.</div>'
    return None


def incomplete_text(run_info: Mapping[str, Any]) -> str | None:
    """What every output of a run that did not finish (interrupted, failed, or still running)
    says first: how many of its units finished and how to continue it."""
    status = run_info.get("status", "finished")
    if status == "finished":
        short = run_info.get("incomplete_sites") or []
        if run_info.get("complete", True) is False and short:  # a run across sites that lost a site on the way
            return (f"INCOMPLETE FEDERATION: site(s) {', '.join(map(str, short))} did not take part in everything "
                    "(missing at the start, late, dropped or gone: see the notes); these numbers are those of the "
                    "sites that answered.")
        return None
    progress = run_info.get("progress") or {}
    how = "`fedcare flower run --resume`" if run_info.get("runtime") == "flower" else "`fedcare resume`"
    return (f"INCOMPLETE: {progress.get('units_done', '?')} of {progress.get('units_total', '?')} units (the run "
            f"{status}); these numbers cover the finished units only. {how} continues the run.")


def unsound_text(run_info: Mapping[str, Any]) -> str | None:
    """What every output of a run whose privacy audit contradicts its accountant says first
    (run.json's `privacy_audit`, `fedcare.privacy.report.audit_verdict`)."""
    verdict = run_info.get("privacy_audit")
    if not isinstance(verdict, Mapping) or verdict.get("sound") is not False:
        return None
    wrong = "; ".join(str(w) for w in verdict.get("unsound") or [])
    return (f"PRIVACY AUDIT FAILED: the run's own canaries prove more leakage than its accountant's epsilon allows "
            f"({wrong}). The DP implementation or its accounting is wrong: do not rely on this epsilon "
            f"(docs/privacy.md, \"The one-run audit\").")


def banner_texts(run_info: Mapping[str, Any]) -> list[str]:
    """The warnings that head every output of a run (its tables, its printed summary): a failed
    privacy audit, then an unfinished run."""
    return [t for t in (unsound_text(run_info), incomplete_text(run_info)) if t]


def incomplete_html(run_info: Mapping[str, Any]) -> str | None:
    """The report's banner for :func:`incomplete_text`."""
    text = incomplete_text(run_info)
    if text is None:
        return None
    body = re.sub(r"`([^`]+)`", r"<code>\1</code>", esc(text))
    return f'<div class="banner incomplete" role="alert">{body}</div>'


def notes_html(run_info: Mapping[str, Any], notes: Sequence[str] = ()) -> str | None:
    """run.json's notes followed by the report's own notes, as a list (None when there are none)."""
    run_notes = run_info.get("notes") or []
    if not isinstance(run_notes, list):
        run_notes = [run_notes]
    all_notes = [str(n) for n in [*run_notes, *notes] if n]
    if not all_notes:
        return None
    return '<h3>Notes</h3><ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in all_notes) + "</ul>"


def page_title(run_info: Mapping[str, Any], run_dir_name: str) -> str:
    return str(run_info.get("title") or f"fedcare run {run_info.get('run_dir') or run_dir_name}".strip())


def render_page(title: str, synthetic: Any, body: Sequence[str], incomplete: str | None = None) -> str:
    """The page skeleton shared by every study's report: head with inline CSS, <h1> title, the
    banners (synthetic data; an unfinished run), then ``body`` (HTML fragments, already
    escaped), the footer."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>",
        f"<h1>{esc(title)}</h1>",
    ]
    banner = banner_html(synthetic)
    if banner:
        parts.append(banner)
    if incomplete:
        parts.append(incomplete)
    parts += list(body)
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    parts.append(
        f"<footer>Generated by fedcare report at {esc(generated)} from metrics.jsonl and run.json. "
        "The same tables are in tables/ (CSV with raw fractions, Markdown), the plots in plots/.</footer>"
    )
    parts.append("</main></body></html>\n")
    return "\n".join(parts)


def render_run_page(
    run_info: Mapping[str, Any],
    *,
    run_dir_name: str,
    known_facts: Sequence[tuple[str, str]],
    extra_facts: Sequence[tuple[str, str]] = (),
    notes: Sequence[str] = (),
    sections: Sequence[tuple[str, str, str, str]] = (),
    plots: Mapping[str, bytes] = {},
    captions: Mapping[str, str] = {},
) -> str:
    """A run's whole page: navigation, the "Run" facts (:func:`facts_table`), notes, then each
    of the study's ``sections`` (anchor, navigation label, heading, HTML already escaped), then
    the plots with their captions."""
    links = [("facts", "Run")] + [(anchor, label) for anchor, label, _, _ in sections] + [("plots", "Plots")]
    parts = [nav_html(links), '<h2 id="facts">Run</h2>', facts_table(run_info, run_dir_name, known_facts, extra_facts)]
    block = notes_html(run_info, notes)
    if block:
        parts.append(block)
    for anchor, _, heading, content in sections:
        parts += [f'<h2 id="{esc(anchor)}">{esc(heading)}</h2>', content]
    parts.append('<h2 id="plots">Plots</h2>')
    parts += [figure_block(name, png, captions.get(name, name)) for name, png in plots.items()]
    unsound = unsound_text(run_info)
    banners = [f'<div class="banner unsound" role="alert">{esc(unsound)}</div>' if unsound else None,
               incomplete_html(run_info)]
    return render_page(page_title(run_info, run_dir_name), run_info.get("synthetic"), parts,
                       "\n".join(b for b in banners if b) or None)
