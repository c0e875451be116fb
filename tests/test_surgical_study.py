"""The surgical tool-presence study (Markert 2022) end to end on a tiny generated Cholec80 +
HeiChole copy: the loss's positive weights, the model, the statistics (Mann-Whitney, CosSim,
GradDiff, ALTV/EGOV), a whole run and its report, resume, Flower's Simulation Engine, the
demo and bad input."""

from __future__ import annotations

import csv
import html
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flower_inprocess import run_experiment_on_flower
from sklearn.metrics import f1_score, precision_recall_fscore_support
from test_run_lifecycle import interrupted_at_round
from torch.nn import functional as F
from typer.testing import CliRunner

from fedcare.algorithms.messages import Message
from fedcare.cli import app
from fedcare.config import ConfigError, to_toml
from fedcare.studies.load import load_config
from fedcare.data.surgical.clients import TOOLS, FrameCache, thesis_clients
from fedcare.data.surgical.synthetic import generate_surgical
from fedcare.deployment.app import check_experiment
from fedcare.runtime.federation import Federation
from fedcare.studies import run as run_module
from fedcare.studies.registry import study_for
from fedcare.studies.run import resume_study, run_study
from fedcare.studies.surgical.aggregate import (ALTV, EGOV, Run, Score, View, final_views, index_run, pooled_score,
                                                views_at)
from fedcare.studies.surgical.data import TEST, TRAIN
from fedcare.studies.surgical.config import (SurgicalData, SurgicalExperiment, SurgicalModel, SurgicalSynthetic,
                                             SurgicalTrain)
from fedcare.studies.surgical.models import WeightsError, build_model, load_weights
from fedcare.studies.surgical.report import (
    convergence, one_sided_p, orderings, stalled, table_a1, table_convergence, unconverged, unsettled,
)
from fedcare.studies.surgical.updates import server_statistics, update_statistics

CLIENTS = ["HEI1", "HEI2", "CHO1", "CHO2", "CHO3"]
ALL = ["lot", "fedavg", "fedprox", "feddyn", "feddg", "fedrep", "fedavg-uniform", "cent"]
SYNTH = {"seed": 5, "videos": 2, "heichole_videos": 4, "seconds": 8, "width": 96, "height": 64}


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("surgical") / "copies"
    generate_surgical(root, **SYNTH)
    return root


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("frames")


def tiny(root: Path, cache: Path, methods=ALL, top: dict | None = None, **train) -> SurgicalExperiment:
    return SurgicalExperiment.model_validate({
        "study": "surgical", "seeds": [1], "methods": list(methods),
        "data": {"root": str(root), "cache": str(cache), "frame_size": [96, 64]},
        "model": {"width": 0.125, "hidden": 16},
        "train": {"rounds": 2, "batch_size": 8, "feddg_bank": 4, **train},
        "runtime": {"threads": 1}, **(top or {}),
    })


def records(run_dir: Path, *types: str) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["type"] in types]


@pytest.fixture(scope="module")
def reference(synth, cache, tmp_path_factory) -> Path:
    return run_study(tiny(synth, cache), tmp_path_factory.mktemp("runs") / "reference")


# -- the loss ------------------------------------------------------------------------------------
def neg_over_pos(labels: np.ndarray) -> np.ndarray:
    pos = labels.sum(0).astype(np.float64)
    return np.where(pos > 0, (len(labels) - pos) / np.maximum(pos, 1), 1.0)


def test_pos_weight_is_per_client_by_default_and_pooled_with_global(synth, cache, tmp_path):
    by_hand = thesis_clients(synth / "cholec80", synth / "heichole", cache=FrameCache(cache, size=(96, 64)), seed=0)
    study = study_for(tiny(synth, cache))
    runtime = study.local_runtime(tmp_path, None)
    task = study.algorithm("fedavg").client.settings.task
    for c in CLIENTS:
        data = runtime.sites[c].data(TRAIN)
        expected = torch.tensor(neg_over_pos(by_hand.labels(c, "train")), dtype=torch.float32)
        assert torch.allclose(task._weight(data), expected, rtol=1e-6)
        y = data.y[:5]
        x = torch.randn(len(y), 6)
        loss = task.batch_loss(data)(lambda inputs: inputs, x, y)  # the model's outputs are x
        assert torch.allclose(loss, F.binary_cross_entropy_with_logits(x, y, pos_weight=expected))
    assert not torch.allclose(task._weight(runtime.sites["HEI1"].data(TRAIN)),
                              task._weight(runtime.sites["CHO2"].data(TRAIN)))  # per client indeed

    pooled = np.concatenate([by_hand.labels(c, "train") for c in CLIENTS])
    study = study_for(tiny(synth, cache, pos_weight="global"))
    runtime = study.local_runtime(tmp_path, None)
    expected = torch.tensor(neg_over_pos(pooled), dtype=torch.float32)
    assert torch.allclose(study.global_pos_weight, expected, rtol=1e-6)
    task = study.algorithm("feddyn").client.settings.task
    assert all(torch.equal(task._weight(runtime.sites[c].data(TRAIN)), study.global_pos_weight) for c in CLIENTS)


# -- statistics ------------------------------------------------------------------------------
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


def test_cossim_and_graddiff_on_a_hand_made_aggregate():
    before = Message({"w": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0])})
    after = Message({"w": torch.tensor([0.5, 0.5]), "b": torch.tensor([1.0])})
    replies = {"a": Message({"w": torch.tensor([1.0, 0.0]), "b": torch.tensor([1.0])}, {"num_examples": 3.0}),
               "b": Message({"w": torch.tensor([0.0, 2.0]), "b": torch.tensor([1.0])}, {"num_examples": 1.0})}
    stats = update_statistics(before, replies, after)
    # a: update (1, 0), global (0.5, 0.5): cos = 0.5 / (1 * sqrt(0.5)); ||(1, 0) - (0.5, 0.5)||^2 = 0.5
    assert stats["a"]["cossim"] == pytest.approx(1 / math.sqrt(2))
    assert stats["a"]["graddiff"] == pytest.approx(0.5)
    # b: update (0, 2): cos = 1 / (2 * sqrt(0.5)); ||(0, 2) - (0.5, 0.5)||^2 = 0.25 + 2.25
    assert stats["b"]["cossim"] == pytest.approx(1 / math.sqrt(2))
    assert stats["b"]["graddiff"] == pytest.approx(2.5)
    assert stats["a"]["n"] == 3.0
    # FedRep sends the body only: the statistics see what was sent and nothing else
    body = update_statistics(Message({"w": before.tensors["w"]}), {c: Message({"w": m.tensors["w"]}) for c, m in
                                                                   replies.items()}, Message({"w": after.tensors["w"]}))
    assert body["b"]["graddiff"] == pytest.approx(2.5)
    still = update_statistics(before, replies, before)  # no global update: the cosine is undefined
    assert math.isnan(still["a"]["cossim"])


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


def test_server_step_and_the_clients_weighted_update_on_a_hand_made_aggregate():
    before = Message({"w": torch.tensor([3.0, 4.0])})  # norm 5
    replies = {"a": Message({"w": torch.tensor([4.0, 4.0])}, {"num_examples": 3.0}),  # update (1, 0)
               "b": Message({"w": torch.tensor([3.0, 8.0])}, {"num_examples": 1.0})}  # update (0, 4)
    after = Message({"w": torch.tensor([3.0, 4.0 + 5.0])})  # the server stepped (0, 5)
    stats = server_statistics(before, replies, after)
    assert stats["server_step"] == pytest.approx(5 / 5)
    # weighted by frames: (3 * (1, 0) + 1 * (0, 4)) / 4 = (0.75, 1), norm 1.25
    assert stats["mean_update"] == pytest.approx(1.25 / 5)


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


# -- the model ----------------------------------------------------------------------------------
def test_the_model_is_torchvisions_with_6_outputs_and_normalises_inside(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    for name, reference in (("alexnet", torchvision.models.alexnet), ("vgg13", torchvision.models.vgg13)):
        torch.manual_seed(3)
        theirs = reference(weights=None, num_classes=6).state_dict()
        torch.manual_seed(3)
        ours = build_model(name).state_dict()
        assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    model = build_model("alexnet", 0.125, 16).eval()
    assert "mean" not in model.state_dict() and "std" not in model.state_dict()  # never in a message
    x = torch.rand(3, 3, 64, 96)
    out = model(x)
    assert out.shape == (3, 6)
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    plain = model.classifier(torch.flatten(model.avgpool(model.features((x - mean) / std)), 1))
    assert torch.allclose(out, plain)
    with torch.no_grad():  # scoring in chunks gives the same outputs
        model.inference_batch = 2
        assert torch.allclose(model(x), plain.detach(), atol=1e-6)


def test_a_weights_file_fills_every_layer_but_the_last_and_a_wrong_one_is_refused(tmp_path):
    torch.manual_seed(0)
    source = build_model("alexnet", 0.125, 16)
    source.classifier[6] = torch.nn.Linear(16, 1000)  # ImageNet's 1000 classes, as torchvision's files
    path = tmp_path / "alexnet-imagenet.pth"
    torch.save(source.state_dict(), path)
    torch.manual_seed(1)
    model = build_model("alexnet", 0.125, 16)
    last = model.classifier[6].weight.detach().clone()
    loaded = load_weights(model, path)
    assert "classifier.6.weight" not in loaded and len(loaded) == len(model.state_dict()) - 2
    assert all(torch.equal(model.state_dict()[k], source.state_dict()[k]) for k in loaded)
    assert torch.equal(model.classifier[6].weight, last)  # the 6-output layer keeps its own init
    with pytest.raises(WeightsError, match=r"alexnet-imagenet.pth: 'features.0.weight' has shape \(8, 3, 11, 11\) in "
                                           r"the file but \(16, 3, 11, 11\) in the model"):
        load_weights(build_model("alexnet", 0.25, 16), path)
    vgg = tmp_path / "vgg.pth"
    torch.save(build_model("vgg13", 0.125, 16).state_dict(), vgg)
    with pytest.raises(WeightsError, match=r"vgg.pth: 'features.0.weight' has shape \(8, 3, 3, 3\)"):
        load_weights(build_model("alexnet", 0.125, 16), vgg)
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises(WeightsError, match="junk.pth: not a PyTorch state-dict file"):
        load_weights(model, tmp_path / "junk.pth")


# -- ALTV and EGOV --------------------------------------------------------------------------
def test_summed_counts_are_the_f1_on_the_union_of_the_test_sets(synth, cache, tmp_path):
    study = study_for(tiny(synth, cache))
    runtime = study.local_runtime(tmp_path, None)
    torch.manual_seed(4)
    model = study.new_model()
    with torch.no_grad():
        model.classifier[6].bias.copy_(torch.tensor([0.5, -0.5, 0.2, -0.2, 0.0, 0.1]))  # some tools on, some off
    federation = Federation(model, study.algorithm("lot"), 1)
    per_client = federation.evaluate({c: runtime.sites[c].data(TEST) for c in CLIENTS}, "multilabel")
    pooled = pooled_score(per_client.values(), TOOLS)
    x = torch.cat([runtime.sites[c].data(TEST).x[:] for c in CLIENTS]).float() / 255
    y = torch.cat([runtime.sites[c].data(TEST).y for c in CLIENTS]).numpy()
    with torch.no_grad():
        pred = (torch.sigmoid(model.eval()(x)) >= 0.5).numpy()
    expected = f1_score(y, pred, average=None, zero_division=0)
    assert [pooled.tools[t] for t in TOOLS] == pytest.approx(list(expected))
    assert pooled.macro == pytest.approx(float(np.mean(expected)))
    # each client's own record: scikit-learn's per-tool precision, recall and F1 on its test frames
    start = 0
    for c in CLIENTS:
        n = len(runtime.sites[c].data(TEST).y)
        p, r, f, _ = precision_recall_fscore_support(y[start:start + n], pred[start:start + n], average=None,
                                                     labels=list(range(len(TOOLS))), zero_division=0)
        start += n
        for what, values in (("precision", p), ("recall", r), ("f1", f)):
            assert [per_client[c][f"{what}/{t}"] for t in TOOLS] == pytest.approx(list(values)), (c, what)
        assert per_client[c]["macro_f1"] == pytest.approx(float(np.mean(f)))


def test_lot_altv_is_the_pooled_score_and_egov_the_own_test_score(reference):
    run = index_run(records(reference, "clients", "client_eval", "round", "client_update"))
    views = views_at(run, "lot", 1, 2)
    for k in CLIENTS:
        mine = [r for r in records(reference, "client_eval") if r["method"] == "lot" and r["round"] == 2 and r["model"] == k]
        assert sorted(r["client"] for r in mine) == sorted(CLIENTS)  # k's model scored at every client
        counts = {what: {t: sum(r[f"{what}/{t}"] for r in mine) for t in TOOLS} for what in ("tp", "fp", "fn")}
        f1 = [2 * counts["tp"][t] / max(1, 2 * counts["tp"][t] + counts["fp"][t] + counts["fn"][t]) for t in TOOLS]
        assert views[ALTV].local[k].macro == pytest.approx(float(np.mean(f1)))
        own = next(r for r in mine if r["client"] == k)
        assert views[EGOV].local[k].macro == pytest.approx(own["macro_f1"])
    table = (reference / "tables" / "table_a1.csv").read_text().splitlines()
    altv = next(line for line in table if line.startswith("ALTV,")).split(",")
    assert [float(v) for v in altv[1:6]] == pytest.approx([views[ALTV].local[k].macro for k in CLIENTS])


# -- a whole run --------------------------------------------------------------------------------
def test_every_method_and_client_is_scored_every_round_and_the_report_has_the_thesis_tables(reference):
    evals = records(reference, "client_eval")
    for method in ALL:
        for rnd in (1, 2):
            got = [r for r in evals if r["method"] == method and r["round"] == rnd]
            if method == "lot":
                assert sorted((r["model"], r["client"]) for r in got) == sorted(itertools.product(CLIENTS, CLIENTS))
            else:
                assert sorted(r["client"] for r in got) == sorted(CLIENTS)
            assert all(0 <= r["macro_f1"] <= 1 and set(TOOLS) <= {k[3:] for k in r if k.startswith("f1/")} for r in got)
    updates = records(reference, "client_update")
    assert {r["method"] for r in updates} == {"fedavg", "fedprox", "feddyn", "feddg", "fedrep", "fedavg-uniform"}
    assert all(len([u for u in updates if u["method"] == "fedrep" and u["round"] == rnd]) == 5 for rnd in (1, 2))
    for name in ("table_a1", "table_a2", "table_6_1", "orderings"):
        assert (reference / "tables" / f"{name}.csv").is_file() and (reference / "tables" / f"{name}.md").is_file()
    header = (reference / "tables" / "table_a1.md").read_text().splitlines()[2]
    assert header == "|  | HEI1 | HEI2 | CHO1 | CHO2 | CHO3 | Mean | Var |"
    rows = [line.split(",")[0] for line in (reference / "tables" / "table_a1.csv").read_text().splitlines()[1:]]
    assert rows[:3] == ["ALTV", "EGOV", "fedavg"] and "cent" in rows
    assert {line.split(",")[0] for line in (reference / "tables" / "table_6_1.csv").read_text().splitlines()[1:]} == \
        {"fedavg", "fedprox", "feddyn", "feddg", "fedrep", "fedavg-uniform"}
    for plot in ("f1_per_round", "f1_per_client", "train_loss", "graddiff", "cossim", "cossim_per_client"):
        assert (reference / "plots" / f"{plot}.png").stat().st_size > 1000
    page = (reference / "report.html").read_text()
    assert "How to read this" in page and "Table A.1" in page and "Table 6.1" in page
    assert "random initialisation" in page and "demo-only sizes" in page  # the deviations are told
    info = json.loads((reference / "run.json").read_text())
    assert info["clients"]["CHO2"]["train"] > info["clients"]["CHO1"]["train"]  # quantity skew, as the thesis


def test_uniform_aggregation_differs_from_weighted(reference):
    final = {r["method"]: r for r in records(reference, "round") if r["round"] == 2 and r["method"].startswith("fedavg")}
    assert final["fedavg"]["train_loss"] != final["fedavg-uniform"]["train_loss"]


def test_an_interrupted_run_resumes_to_byte_identical_records(synth, cache, reference, tmp_path, monkeypatch):
    config = tiny(synth, cache, methods=["lot", "feddg", "fedrep"])
    whole = run_study(config, tmp_path / "whole")
    # Ctrl-C in FedDG's second round: LOT's 5 models x 2 rounds, then FedDG's round 1 finished
    stopped = interrupted_at_round(monkeypatch, 12, lambda: run_study(config, tmp_path / "run"))
    assert run_module.stop_note(stopped).startswith(f"kept {tmp_path / 'run.partial'} (11 of 14 units finished)")
    resume_study(tmp_path / "run.partial")
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == (whole / "metrics.jsonl").read_bytes()
    # the same methods in a longer list give the same records: every draw comes from the seed
    same = [r for r in records(reference, "client_eval") if r["method"] in ("lot", "feddg", "fedrep")]
    assert records(whole, "client_eval") == same


def test_server_anneal_stops_the_servers_steps_and_resumes_byte_identical(synth, cache, tmp_path, monkeypatch):
    """train.server_anneal (not the thesis): the server's AdamW rate is held, then annealed to 0
    at the last round, whose step is then 0; the schedule survives a checkpoint."""
    config = tiny(synth, cache, methods=["fedavg"], rounds=3, server_anneal=True, pct_start=0.34)
    whole = run_study(config, tmp_path / "whole")
    steps = {r["round"]: (r["server_step"], r["server_lr"]) for r in records(whole, "round")}
    assert steps[1][0] > 0 and steps[2][0] > 0 and steps[3] == (0.0, 0.0) and steps[1][1] == 0.001
    constant = run_study(tiny(synth, cache, methods=["fedavg"], rounds=3), tmp_path / "constant")
    assert {r["round"]: r["server_step"] for r in records(constant, "round")}[3] > 0
    assert "the FL server's AdamW rate is held at 0.001 for 1 rounds" in html.unescape((whole / "report.html").read_text())
    stopped = interrupted_at_round(monkeypatch, 2, lambda: run_study(config, tmp_path / "run"))
    assert run_module.stop_note(stopped).startswith(f"kept {tmp_path / 'run.partial'} (1 of 3 units finished)")
    resume_study(tmp_path / "run.partial")
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == (whole / "metrics.jsonl").read_bytes()


# -- Flower ---------------------------------------------------------------------------------------
def test_flowers_simulation_engine_equals_the_simulator(synth, cache, reference, tmp_path):
    config = tiny(synth, cache, methods=["lot", "fedavg", "feddyn", "feddg", "fedrep"])
    run_experiment_on_flower(config, tmp_path / "flower", len(CLIENTS), "surgical.toml")
    kinds = ("client_eval", "round", "client_update")
    expected = [r for r in records(reference, *kinds) if r["method"] in config.methods]
    assert len(expected) > 100 and records(tmp_path / "flower", *kinds) == expected  # bit for bit
    info = json.loads((tmp_path / "flower" / "run.json").read_text())
    assert info["runtime"] == "flower" and info["sites"] == {c: c for c in CLIENTS}


@pytest.mark.parametrize("change, message", [
    ({"methods": ["fedavg", "cent"]}, "method 'cent' trains one model on every client's training frames pooled"),
    ({"train": {"pos_weight": "global"}}, r"train.pos_weight = 'global' computes the BCE positive weights over every"),
])
def test_what_pools_data_is_refused_across_sites(tmp_path, change, message):
    raw = {"study": "surgical", "methods": ["fedavg"], "data": {"root": str(tmp_path)}, **change}
    with pytest.raises(ConfigError, match=message):
        check_experiment(SurgicalExperiment.model_validate(raw), "surgical.toml")
    check_experiment(SurgicalExperiment.model_validate({**raw, "methods": ["fedavg", "lot"], "train": {}}),
                     "surgical.toml")  # LOT and the FL methods run across sites


def test_the_shipped_sites_config_runs_across_sites_with_a_site_per_client():
    config = load_config(Path(__file__).parents[1] / "configs" / "surgical" / "sites.toml")
    check_experiment(config, "sites.toml")
    assert sorted(config.deployment.sites.values()) == sorted(CLIENTS) and "cent" not in config.methods


def test_a_site_reads_its_own_copy_and_says_what_is_missing(synth, cache, tmp_path):
    study = study_for(tiny(synth, cache, top={"deployment": {"sites": {"salem": "HEI2"}}}))
    site = study.open_site("salem", synth)
    assert site.client == "HEI2" and site.summary()["train"] > 0 and site.synthetic
    (tmp_path / "cholec80").mkdir()
    with pytest.raises(Exception, match=r"site 'salem' \(HEI2\): .*heichole does not exist"):
        study.open_site("salem", tmp_path)


# -- the CLI ----------------------------------------------------------------------------------
def _fails_cleanly(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    flat = result.output.replace("\n", " ")
    for needle in needles:
        assert needle in flat, result.output


def test_demo_surgical_is_listed_runs_and_prints_table_a1(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the demo's decoded frames stay in its run directory
    monkeypatch.delenv("FEDCARE_CACHE", raising=False)
    runner = CliRunner()
    listed = runner.invoke(app, ["demo", "--help"])
    assert listed.exit_code == 0 and "surgical" in listed.output
    shrink = ["data.synthetic.videos=2", "data.synthetic.heichole_videos=4", "data.synthetic.seconds=8",
              "data.synthetic.width=96", "data.synthetic.height=64", "data.frame_size=[96, 64]", "model.width=0.125",
              "model.hidden=16", "train.rounds=1", "train.batch_size=8", "methods=['lot', 'fedavg', 'cent']"]
    result = runner.invoke(app, ["demo", "surgical", "--out", str(tmp_path / "demo"),
                                 *[a for s in shrink for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    assert "Table A.1: final macro F1 per client test set" in result.output
    assert "| ALTV |" in result.output and "| FedAvg |" in result.output and "| CENT |" in result.output
    assert "Table 6.1" in result.output
    assert "The thesis's orderings on this run" in result.output and "| FedAvg > ALTV |" in result.output
    assert "Has each method's training loss converged?" in result.output  # 1 round: none has
    converged = [row["converged"] for row in csv.DictReader((tmp_path / "demo" / "tables" / "convergence.csv").open())]
    assert converged == ["False"] * 3
    assert json.loads((tmp_path / "demo" / "run.json").read_text())["synthetic"] is True
    assert (tmp_path / "demo" / "synthetic-data" / "cholec80").is_dir()
    assert any((tmp_path / "demo" / "frame-cache").rglob("*")) and not (tmp_path / "home" / ".cache" / "fedcare").exists()
    assert "<th>Run directory</th><td>demo</td>" in (tmp_path / "demo" / "report.html").read_text()


def test_bad_input_is_one_line_naming_the_file(synth, cache, tmp_path):
    runner = CliRunner()
    missing = tmp_path / "missing.toml"
    missing.write_text('study = "surgical"\nmethods = ["fedavg"]\n[data]\nroot = "no-such-folder"\n')
    _fails_cleanly(runner.invoke(app, ["run", str(missing), "--out", str(tmp_path / "r1")]),
                   str(tmp_path / "no-such-folder"), "no such folder")
    vgg = tmp_path / "vgg13.pth"
    torch.save(build_model("vgg13", 0.125, 16).state_dict(), vgg)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(to_toml(tiny(synth, cache, methods=["fedavg"])) + "")
    result = runner.invoke(app, ["run", str(wrong), "--out", str(tmp_path / "r2"), "--set", f"model.weights='{vgg}'"])
    _fails_cleanly(result, str(vgg), "'features.0.weight' has shape (8, 3, 3, 3) in the file")
    both = tmp_path / "both.toml"
    both.write_text('study = "surgical"\nmethods = ["fedavg"]\n[data]\nroot = "x"\n[data.synthetic]\nseed = 1\n')
    _fails_cleanly(runner.invoke(app, ["run", str(both)]), "give exactly one of data.root")
    bad = tmp_path / "bad.toml"
    bad.write_text('study = "surgical"\nmethods = ["fedsgd"]\n[data]\nroot = "x"\n')
    _fails_cleanly(runner.invoke(app, ["run", str(bad)]), "methods.0")


def test_the_study_page_documents_every_config_key():
    page = (Path(__file__).parents[1] / "docs" / "studies" / "surgical.md").read_text()
    section = page[page.index("\n## Config options\n"):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    for table, model in (("data", SurgicalData), ("model", SurgicalModel), ("train", SurgicalTrain)):
        for key in model.model_fields:
            if key != "synthetic":
                assert f"`{table}.{key}`" in section, f"{table}.{key}"
    synthetic = next(line for line in section.splitlines() if line.startswith("| `[data.synthetic]`"))
    assert all(f"`{key}`" in synthetic for key in SurgicalSynthetic.model_fields)
    top = [key for key in SurgicalExperiment.model_fields if key not in ("data", "model", "train", "runtime", "deployment")]
    assert all(f"`{key}`" in section for key in top)


def test_a_site_caches_where_the_site_says_never_where_the_experiment_says(synth, tmp_path, monkeypatch):
    """`data.cache` is the researcher's file choosing a path on a hospital's disk: a site decodes
    into its own --state-dir's cache (deployment/app.py), else the user's cache."""
    from fedcare.deployment.app import _site_cache

    experiments_choice = tmp_path / "chosen-by-the-experiment"
    study = study_for(tiny(synth, experiments_choice, top={"deployment": {"sites": {"salem": "HEI2"}}}))
    site_cache = _site_cache(_Context({"site": "salem", "state-dir": str(tmp_path / "state")}))
    assert site_cache == tmp_path / "state" / "cache"
    study.open_site("salem", synth, site_cache)
    assert any(site_cache.rglob("*.npy")) and not experiments_choice.exists()
    monkeypatch.setenv("FEDCARE_CACHE", str(tmp_path / "users-cache"))
    study.open_site("salem", synth)  # no state dir: the user's own cache
    assert any((tmp_path / "users-cache").rglob("*.npy")) and not experiments_choice.exists()


class _Context:
    def __init__(self, node_config, run_config=None):
        self.node_config, self.run_config = node_config, run_config or {}
