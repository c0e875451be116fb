"""The generic rounds report (studies/rounds_report.py) on hand-made records: the worst client
and the best single-site model follow the metric's direction, and the summary in Markdown."""

import json
import math

import pytest

from fedcare.studies.rounds_report import aggregate, best_site_model, metric_named, summary_markdown

# final-round values per (method, client); model "a"/"b": single-site models trained at a or b
FINAL = {("fedavg", None): {"a": 0.30, "b": 0.50, "c": 0.70}, ("single-site", "a"): {"a": 0.20, "b": 0.90, "c": 0.40},
         ("single-site", "b"): {"a": 0.60, "b": 0.60, "c": 0.60}}


def evals(metric: str) -> list[dict]:
    out = []
    for (method, model), values in FINAL.items():
        for client, value in values.items():
            out.append({"type": "client_eval", "method": method, "seed": 0, "round": 5, "client": client, "n": 10,
                        metric: value, **({"model": model} if model else {})})
    return out


def test_higher_is_better_worst_is_the_lowest_and_the_best_site_model_the_highest_mean():
    agg = aggregate(evals("roc_auc"), "roc_auc")
    assert agg.methods == ["fedavg", "single-site (a)", "single-site (b)"] and agg.federation_rows == ["fedavg"]
    assert (agg.summary["fedavg"].worst, agg.summary["fedavg"].best) == (0.30, 0.70)
    assert agg.summary["single-site (a)"].mean == pytest.approx(0.5)
    assert best_site_model(agg, metric_named("roc_auc")) == "single-site (b)"  # 0.6 > 0.5


def test_lower_is_better_worst_is_the_highest_and_the_best_site_model_the_lowest_mean():
    agg = aggregate(evals("loss"), "loss")
    assert (agg.summary["fedavg"].worst, agg.summary["fedavg"].best) == (0.70, 0.30)
    assert best_site_model(agg, metric_named("loss")) == "single-site (a)"  # 0.5 < 0.6
    assert metric_named("loss").fmt(0.4567) == "0.457" and metric_named("roc_auc").fmt(0.4567) == "45.7"
    assert metric_named("brier").key == "brier" and not metric_named("brier").fraction  # unknown: shown as is


def test_the_summary_in_markdown_has_the_methods_then_the_best_site_model(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals("roc_auc")))
    (tmp_path / "run.json").write_text(json.dumps({"metric": "roc_auc"}))
    lines = summary_markdown(tmp_path).splitlines()
    assert lines[0] == "| Method | ROC AUC (mean ± SD across clients) | worst client |"
    assert lines[2] == "| fedavg | 50.0 ± 16.3 | 30.0 |" and lines[3] == "| single-site (b) | 60.0 ± 0.0 | 60.0 |"
    assert len(lines) == 4 and not math.isnan(aggregate(evals("roc_auc"), "roc_auc").summary["fedavg"].sd)


@pytest.mark.parametrize("value", [7.5, -0.1, float("inf")])
def test_a_fraction_out_of_range_is_an_error_naming_the_record(value):
    """accuracy 7.5 was shown as 750.0; a loss (not a fraction) may be any number."""
    from fedcare.errors import InputError

    records = evals("accuracy")
    records[1]["accuracy"] = value
    with pytest.raises(InputError, match=r"metrics.jsonl: client_eval record 2: accuracy = .*: not a fraction"):
        aggregate(records, "accuracy")
    losses = evals("loss")
    losses[1]["loss"] = 7.5
    assert aggregate(losses, "loss").summary["fedavg"].worst == 7.5
