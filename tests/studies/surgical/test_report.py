"""The surgical study's report (fedcare.studies.surgical.report): the one-sided Mann-Whitney test
against a hand example and enumeration, Table A.1, the thesis's orderings, stalled, unconverged
and unsettled methods and the convergence criterion, on hand-made records."""

from __future__ import annotations

import itertools
import math

import pytest

from fedcare.studies.surgical.aggregate import ALTV, Run, Score, View, final_views, index_run
from fedcare.studies.surgical.report import (
    convergence, one_sided_p, orderings, stalled, table_a1, table_convergence, unconverged, unsettled,
)


def exact_less_p(x, y) -> float:
    """P(U_x <= u_obs) under H0 by enumerating every way of drawing x's ranks (no ties)."""
    pooled = sorted(x + y)
    u = lambda xs, ys: sum(a > b for a in xs for b in ys)  # noqa: E731
    observed = u(x, y)
    draws = [u([pooled[i] for i in pick], [pooled[i] for i in range(len(pooled)) if i not in pick])
             for pick in itertools.combinations(range(len(pooled)), len(x))]
    return sum(d <= observed for d in draws) / len(draws)


def test_mann_whitney_one_sided_against_a_hand_example_and_enumeration():
    assert one_sided_p([1.0, 2.0], [3.0, 4.0, 5.0]) == pytest.approx(0.1)  # U = 0: 1 of C(5, 2) = 10 orders
    assert one_sided_p([3.0, 4.0, 5.0], [1.0, 2.0]) == pytest.approx(1.0)
    x, y = [0.1, 0.45, 0.7, 0.2], [0.3, 0.5, 0.9, 0.8, 0.6]
    assert one_sided_p(x, y) == pytest.approx(exact_less_p(x, y))
    assert math.isnan(one_sided_p([], y))


def test_table_a1_has_client_columns_the_change_vs_altv_in_brackets_mean_and_variance():
    clients = ["HEI1", "CHO1"]
    run = Run(clients=clients, tools=["a", "b"], train_frames={"HEI1": 1.0, "CHO1": 3.0}, methods=[], seeds=[])

    def view(hei1: tuple, cho1: tuple) -> View:
        return View({"HEI1": Score(dict(zip("ab", hei1))), "CHO1": Score(dict(zip("ab", cho1)))}, Score({}))

    views = {ALTV: view((0.2, 0.4), (0.5, 0.5)), "fedavg": view((0.6, 0.6), (0.3, 0.5))}  # macros 0.3 0.5 / 0.6 0.4
    table = table_a1(run, views)
    assert table.columns == ["", "HEI1", "CHO1", "Mean", "Var"]
    assert table.rows[0] == ["ALTV", "0.300", "0.500", "0.400", "0.01000"]
    assert table.rows[1] == ["FedAvg", "0.600 (+0.300)", "0.400 (-0.100)", "0.500 (+0.100)", "0.01000"]
    # across the rows above, per client: mean and population variance
    assert table.rows[2] == ["Mean (all)", "0.450", "0.450", "", ""]
    assert table.rows[3] == ["Var (all)", "0.02250", "0.00250", "", ""]
    assert table.csv_rows[1][:4] == ["fedavg", pytest.approx(0.6), pytest.approx(0.4), pytest.approx(0.5)]


def test_the_thesis_orderings_and_stalled_methods_are_read_from_the_records():
    run = Run(clients=["HEI1"], tools=["a"], train_frames={"HEI1": 1.0}, methods=[], seeds=[])
    views = {name: View({"HEI1": Score({"a": f1})}, Score({})) for name, f1 in
             (("ALTV", 0.4), ("fedavg", 0.5), ("feddyn", 0.45), ("fedprox", 0.3), ("cent", 0.49))}
    checks = orderings(views)
    assert [c[:4] for c in checks] == [("FedAvg > ALTV", 0.5, 0.4, True), ("FedDyn <= ALTV", 0.45, 0.4, False),
                                       ("FedProx > ALTV", 0.3, 0.4, False), ("CENT >= FedAvg - 0.02", 0.49, 0.5, True)]
    # p: Table 6.1's one-sided test that the left side is larger, on the client x tool values
    assert [c.p for c in checks] == [one_sided_p([0.4], [0.5]), one_sided_p([0.4], [0.45]), one_sided_p([0.4], [0.3]),
                                     one_sided_p([0.5], [0.49])]
    assert all(c.n == 1 for c in checks) and checks[0].p < checks[2].p
    run.rounds = [{"method": m, "seed": 0, "round": r, "train_loss": loss, "n_train": 10}
                  for m, losses in (("lot", (1.004, 1.0)), ("fedavg", (1.0, 0.8))) for r, loss in enumerate(losses, 1)]
    notes = stalled(run)
    assert len(notes) == 1 and notes[0].startswith("LOT: the training loss moved only from 1.004 (round 1) to 1.000")


def test_a_loss_has_converged_when_its_last_3_rounds_settle_and_it_has_fallen():
    """docs/studies/surgical.md's criterion: (max - min) / L_R over rounds R-3..R < 2%, and
    L_1 - L_R > 1% of L_1 (LOT's flat 1.004 -> 1.0 in the old 12-round demo is no convergence)."""
    run = Run(clients=["HEI1"], tools=["a"], train_frames={"HEI1": 1.0}, methods=[], seeds=[])
    curves = {"fedavg": (1.0, 0.8, 0.6, 0.509, 0.5, 0.505, 0.5),  # settle 0.018: converged
              "fedprox": (1.0, 0.8, 0.6, 0.511, 0.5, 0.505, 0.5),  # settle 0.022: not yet
              "lot": (1.004, 1.003, 1.002, 1.001, 1.0),  # settled but never fell
              "cent": (1.0, 0.5, 0.5)}  # too few rounds to tell
    run.rounds = [{"method": m, "seed": 0, "round": r, "train_loss": loss, "n_train": 10}
                  for m, losses in curves.items() for r, loss in enumerate(losses, 1)]
    result = {c.method: (c.settle, c.fall, c.converged) for c in convergence(run)}
    assert result["fedavg"] == (pytest.approx(0.018), pytest.approx(0.5), True)
    assert result["fedprox"][0] == pytest.approx(0.022) and result["fedprox"][2] is False
    assert result["lot"][0] < 0.02 and result["lot"][1] == pytest.approx(0.004 / 1.004) and result["lot"][2] is False
    assert math.isnan(result["cent"][0]) and result["cent"][2] is False


def test_unconverged_methods_are_explained_by_what_the_run_recorded():
    run = Run(clients=["HEI1"], tools=["a"], train_frames={"HEI1": 1.0}, methods=[], seeds=[])
    curves = {"fedavg": (1.0, 0.6, 0.55, 0.6, 0.55),  # still swinging, the server still stepping
              "feddyn": (1.0, 0.9, 1.2, 1.25, 1.3),  # rose above its start
              "cent": (1.0, 0.6, 0.5, 0.5, 0.5, 0.5),  # converged: no note
              "feddg": (1.0, 0.6, 0.55, 0.6, 0.55)}  # swinging with the server's rate annealed: noise
    steps = {"fedavg": (0.004, 0.00001), "feddyn": (0.01, 0.001), "feddg": (0.00001, 0.000001)}  # last 3 summed
    rates = {"feddg": lambda r: 0.001 * (5 - r) / 4}  # annealed to 0 at round 5; the others constant
    run.rounds = [{"method": m, "seed": 0, "round": r, "train_loss": loss, "n_train": 10,
                   **({"server_step": steps[m][0] * (r > 1), "mean_update": steps[m][1],
                       "server_lr": rates.get(m, lambda r: 0.001)(r)} if m in steps else {})}
                  for m, losses in curves.items() for r, loss in enumerate(losses, 1)]
    notes = unconverged(run)
    assert len(notes) == 3
    assert notes[2].startswith("FedDG: its training loss moved by 9.1% over the last 3 rounds, in which the server's "
                               "steps (its learning rate annealed) came to 0.003% of the model's norm")
    assert "per-epoch loss's own noise (dropout, amplitude spectra redrawn every epoch)" in notes[2]
    assert notes[0].startswith("FedAvg: its training loss moved by 9.1% over the last 3 rounds")
    assert "updates came to 0.003% of the model's norm" in notes[0] and "by 1.2%, 400 times as far" in notes[0]
    assert notes[1].startswith("FedDyn: its training loss ended above its first round's (1.000 -> 1.300): it diverged")
    rows = {row[0]: row for row in table_convergence(run).rows}
    assert rows["FedAvg"][6:] == ["1.2%", "0.003%"] and rows["CENT"][5:] == ["yes", "-", "-"]


def test_an_ordering_within_the_last_rounds_swings_is_called_unsettled():
    def scored(method, rnd, f1, **counts):
        return {"type": "client_eval", "method": method, "seed": 0, "round": rnd, "client": "A", "f1/t": f1,
                **{f"{k}/t": v for k, v in counts.items()}}

    records = [{"type": "clients", "clients": {"A": {"train": 1, "test": 1}}, "tools": ["t"]}]
    for rnd, (avg, prox) in enumerate(((0.5, 0.7), (0.9, 0.7), (0.5, 0.7), (0.7, 0.9)), 1):
        records += [{**scored("lot", rnd, 2 / 3, tp=1, fp=1, fn=0), "model": "A"}, scored("fedavg", rnd, avg),
                    scored("fedprox", rnd, prox)]
    run = index_run(records)
    views = final_views(run)
    notes = unsettled(run, views)  # ALTV = 2/3; FedAvg ends 0.033 above it after swings of 0.4, FedProx 0.233 after 0.2
    assert len(notes) == 1 and notes[0].startswith("FedAvg: its Table A.1 mean moved by up to 0.400")
    assert "(+0.033)" in notes[0]
