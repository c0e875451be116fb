"""The face-verification study (Hess): TAR@FAR against scikit-learn's ROC, ArcFace logits by
hand, client-sized local heads, and a small end-to-end run on synthetic CelebA in which the
unseen clients never receive a training message."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_curve

from fedcare.algorithms.split import load_tensors
from fedcare.data.celeba.synthetic import generate_celeba
from fedcare.evaluation.verification import pairs_tar_at_far, sample_pairs, tar_at_far
from fedcare.models.face_resnet import FaceResNet, arcface_logits
from fedcare.runtime.clients import LocalClients
from fedcare.studies.facerec.config import FacerecExperiment
from fedcare.studies.facerec.data import Evaluation
from fedcare.studies.run import run_study


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread (as the runs' runtime.threads): on 2 shared cores two threads spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("seed, far, n", [(0, 0.1, 1000), (1, 0.1, 1000), (2, 0.05, 1000), (3, 0.3, 1000),
                                          (4, 0.29, 100), (5, 0.1, 37)])
def test_tar_at_far_is_scikit_learns_roc_read_at_the_far_asked_for(seed, far, n):
    rng = np.random.default_rng(seed)
    genuine, impostor = rng.normal(1.0, 1.0, 1000), rng.normal(0.0, 1.0, n)
    tar, reached, threshold = tar_at_far(genuine, impostor, far)
    fpr, tpr, _ = roc_curve(np.r_[np.ones(1000), np.zeros(n)], np.r_[genuine, impostor], drop_intermediate=False)
    assert tar == pytest.approx(tpr[fpr <= far].max())  # the ROC's best TAR at the FAR asked for
    assert reached == pytest.approx(fpr[fpr <= far].max())  # no ties: exactly floor(far * n) impostors pass
    assert (impostor > threshold).mean() == reached


def test_tar_at_far_with_tied_impostor_scores_stays_within_the_far():
    # 10 impostors, FAR 0.2 allows 2; the top three tie, so the ROC's point below 0.2 accepts none
    impostor = np.array([0.9, 0.9, 0.9] + [0.1] * 7)
    genuine = np.array([0.95, 0.5, 0.05])
    fpr, tpr, _ = roc_curve(np.r_[np.ones(3), np.zeros(10)], np.r_[genuine, impostor], drop_intermediate=False)
    assert tar_at_far(genuine, impostor, 0.2)[:2] == (pytest.approx(tpr[fpr <= 0.2].max()), 0.0)
    assert tar_at_far(genuine, impostor, 0.3)[:2] == (pytest.approx(2 / 3), pytest.approx(0.3))


def test_sampled_pairs_are_genuine_and_impostor_and_score_by_cosine():
    y = np.array([0, 0, 0, 1, 1, 2])  # identity 2 has a single image: never the d of a genuine pair
    genuine, impostor = sample_pairs(y, np.random.default_rng(0), 200, 300)
    assert genuine.shape == (200, 2) and impostor.shape == (300, 2)
    assert (y[genuine[:, 0]] == y[genuine[:, 1]]).all() and (genuine[:, 0] != genuine[:, 1]).all()
    assert (y[impostor[:, 0]] != y[impostor[:, 1]]).all() and 5 not in genuine
    e = torch.tensor([[1.0, 0], [2, 0], [1, 0.1], [0, 1], [0, 3], [-1, 0]])
    result = pairs_tar_at_far(e, genuine, impostor, 0.1)
    cos = torch.nn.functional.normalize(e, dim=1) @ torch.nn.functional.normalize(e, dim=1).T
    expected = tar_at_far(cos[genuine[:, 0], genuine[:, 1]].numpy(), cos[impostor[:, 0], impostor[:, 1]].numpy())
    assert result["tar"] == pytest.approx(expected[0]) and result["threshold"] == pytest.approx(expected[2])


def test_arcface_logits_by_hand():
    e = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    w = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0]])
    y = torch.tensor([1, 0])
    s, m = 8.0, 0.5
    logits = arcface_logits(e, w, y, s, m)
    cos = [[0.6, 0.8, 1 / (5 * math.sqrt(2))], [1.0, 0.0, -1 / math.sqrt(2)]]
    expected = [[s * cos[0][0], s * math.cos(math.acos(0.8) + m), s * cos[0][2]],  # standard ArcFace: no margin
                [s * math.cos(math.acos(1 - 1e-7) + m), s * 0.0, s * cos[1][2]]]   # on the non-target classes
    assert torch.allclose(logits, torch.tensor(expected), atol=2e-4)  # float32 acos near 1
    masked = arcface_logits(e, w, y, s, m, present=torch.tensor([True, True, False]))
    assert torch.isinf(masked[:, 2]).all() and torch.allclose(masked[:, :2], logits[:, :2])


def test_a_local_head_takes_each_clients_size_and_other_shapes_stay_errors():
    model = FaceResNet(0)
    load_tensors(model, {"head.weight": torch.ones(7, 512)})
    assert model.head.weight.shape == (7, 512) and isinstance(model.head.weight, torch.nn.Parameter)
    assert model.state_dict()["head.weight"].sum() == 7 * 512
    with pytest.raises(RuntimeError):
        load_tensors(model, {"embedding.bias": torch.ones(3)})  # not client-sized: a shape mismatch is an error


@pytest.fixture(scope="module")
def celeba(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("facerec") / "celeba"
    generate_celeba(root, seed=0, identities=16, images_per_identity=12, workers=1)
    return root


def small_config(root: Path, cache: Path, methods=("fedavg-local", "hfmaml"), **train) -> FacerecExperiment:
    return FacerecExperiment.model_validate({
        "study": "facerec", "seeds": [0], "methods": list(methods),
        "data": {"root": str(root), "partition": "equal", "identities": 12, "clients": 4, "image_size": 16,
                 "detector_scale_factor": 1.2, "detector_min_size": 64, "cache": str(cache)},
        "protocol": {"unseen": [4], "paths": 2, "genuine_pairs": 50, "impostor_pairs": 50},
        "train": {"rounds": 2, "batch_size": 4, "local_steps": 2, "tune_steps": 2, **train},
        "runtime": {"threads": 1},
    })


def records(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


def test_small_run_end_to_end_unseen_clients_never_train(celeba, tmp_path, monkeypatch):
    fitted, heads = [], {}
    fit = LocalClients.fit

    def spy(self, phase, rnd, work):
        fitted.extend(work)
        replies = fit(self, phase, rnd, work)
        local = self.half.split.private_paths == ("head",)
        for c, reply in replies.items():
            assert ("head.weight" in reply.tensors) != local  # a local head never leaves the client
            if local:
                heads[c] = tuple(self.runners[c].state["head.weight"].shape)
        return replies

    monkeypatch.setattr(LocalClients, "fit", spy)
    run = run_study(small_config(celeba, tmp_path / "cache"), tmp_path / "run")
    assert set(fitted) == {1, 2, 3}  # client 4 is unseen: no training message ever
    evals = records(run, "client_eval")
    assert {(r["method"], r["client"], r["path"]) for r in evals} == {
        (m, c, p) for m in ("fedavg-local", "hfmaml") for c in (1, 2, 3, 4) for p in (1, 2)}
    for r in evals:  # a test split with one image per identity has no genuine pair: TAR is undefined (null)
        scored = r["genuine_pairs"] == 50
        assert scored == (r["tar_global"] is not None) == (r["tar_tuned"] is not None)
        assert not scored or (0 <= r["tar_global"] <= 1 and 0 <= r["tar_tuned"] <= 1)
    assert sum(r["genuine_pairs"] == 50 for r in evals) >= len(evals) // 2
    # local heads: each training client's own size (3 identities each here), never in a reply
    assert heads == {c: (3, 512) for c in (1, 2, 3)}
    report = (run / "tables" / "tar.md").read_text()
    assert "trained clients: global" in report and "unseen clients: tuned" in report and "hfmaml" in report
    info = json.loads((run / "run.json").read_text())
    assert info["unseen"] == [4] and info["training_clients"] == [1, 2, 3]


def _federation(method: str, **options):
    from fedcare.runtime.federation import Federation
    from fedcare.studies.facerec.data import FaceData
    from fedcare.studies.facerec.methods import make_algorithm

    config = small_config(Path("."), Path("."), methods=[method], local_steps=2)
    config = config.model_copy(update={"options": config.options.model_copy(update=options)})
    g = torch.Generator().manual_seed(0)
    data = {c: FaceData(torch.randint(0, 256, (12, 3, 16, 16), dtype=torch.uint8, generator=g),
                        torch.arange(12) % 3 + 3 * (c - 1), classes=6) for c in (1, 2)}
    torch.manual_seed(0)
    federation = Federation(FaceResNet(6), make_algorithm(method, config), seed=0)
    return federation, data


@pytest.mark.parametrize("method", ["fedavg-reg", "hfmaml-reg"])
def test_embedding_regularisation_is_the_plain_method_at_c_0_and_pulls_towards_the_received_model(method):
    def trained(c):
        federation, data = _federation(method, reg_c=c)
        start = {k: v.clone() for k, v in federation.global_message.tensors.items()}
        federation.run_round("train", 1, data)
        return federation.global_message.tensors, start

    plain_fed, data = _federation(method.replace("-reg", ""))
    plain_fed.run_round("train", 1, data)
    zero, start = trained(0.0)
    assert all(torch.equal(zero[k], plain_fed.global_message.tensors[k]) for k in zero)  # C = 0: the plain method
    strong, _ = trained(1000.0)
    weights = [k for k in start if k.endswith("weight")]
    moved = lambda t: sum(float((t[k] - start[k]).norm()) for k in weights)
    assert moved(strong) != moved(zero)  # the term changes training


def test_q_fedavg_gets_the_arcface_loss_at_the_received_model():
    from fedcare.algorithms.qfedavg import LOSS_AT_GLOBAL

    federation, data = _federation("fedavg-fair")
    replies = federation.clients.fit("train", 1, federation.work(data))
    losses = [r.scalars[LOSS_AT_GLOBAL] for r in replies.values()]
    assert all(math.isfinite(v) and v > 0 for v in losses)  # an embedding task's predict() loss would be NaN
    plain, _ = _federation("fedavg")
    after = federation.server.aggregate(federation.global_message, replies)
    mean = plain.server.aggregate(plain.global_message, replies)
    assert not torch.equal(after.tensors["embedding.weight"], mean.tensors["embedding.weight"])


@pytest.mark.parametrize("break_it, pattern", [
    (lambda root: (root / "identity_CelebA.txt").unlink(), r"identity_CelebA\.txt: identity file missing"),
    (lambda root: (root / "list_attr_celeba.txt").write_text(
        (root / "list_attr_celeba.txt").read_text().replace(" 1\n", "\n", 1)), r"list_attr_celeba\.txt:\d+: expected 41 fields"),
])
def test_fedcare_run_names_the_bad_file_in_one_line(celeba, tmp_path, break_it, pattern):
    import re
    import shutil

    from typer.testing import CliRunner

    from fedcare.cli import app
    from fedcare.config import to_toml

    root = tmp_path / "celeba"
    shutil.copytree(celeba, root)
    break_it(root)
    (tmp_path / "x.toml").write_text(to_toml(small_config(root, tmp_path / "cache")))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "x.toml"), "--out", str(tmp_path / "run")])
    assert result.exit_code != 0 and re.search(pattern, result.output)
    assert "Traceback" not in result.output


def test_an_unseen_client_outside_the_partition_is_a_config_error_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"protocol\.unseen: \[9\] are not clients \(1\.\.4\)"):
        FacerecExperiment.model_validate({**small_config(tmp_path, tmp_path).model_dump(mode="json"),
                                          "protocol": {"unseen": [9]}})


def test_fedfr_keeps_both_heads_and_its_previous_model_and_its_terms_by_hand():
    from fedcare.models.face_resnet import BinaryHead, binary_loss, moon_contrastive
    from fedcare.studies.facerec.methods import PREVIOUS

    federation, data = _federation("fedfr")
    for rnd in (1, 2):
        replies = federation.clients.fit("train", rnd, federation.work(data))
        federation.global_message = federation.server.aggregate(federation.global_message, replies)
        assert all(not k.startswith(("head.", "binary_head.")) for r in replies.values() for k in r.tensors)
        assert all(math.isfinite(r.scalars["train_loss"]) for r in replies.values())
    state = federation.state_of(1)
    assert state["head.weight"].shape == (6, 512) and state["binary_head.weight"].shape == (6, 512)
    assert set(replies[1].tensors) <= {k[len(PREVIOUS):] for k in state if k.startswith(PREVIOUS)}
    e = torch.randn(4, 8)
    assert float(moon_contrastive(e, e, e)) == pytest.approx(math.log(2))  # f_prev = f_glob: no preference
    head = BinaryHead(2, 2)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        head.bias.fill_(0.5)
    s, m, lam = 8.0, 0.4, 0.7
    expected = (lam / s * math.log1p(math.exp(-s * (1 - m) - 0.5))
                + (1 - lam) / s * math.log1p(math.exp(s * (0 + m) + 0.5)))
    assert float(binary_loss(torch.tensor([[3.0, 0.0]]), head, torch.tensor([0])).detach()) == pytest.approx(expected, rel=1e-5)


def test_report_means_per_client_then_over_clients_and_std_across_clients_per_run():
    from scipy import stats

    from fedcare.studies.facerec.report import Scores, paired_tests

    def ev(method, seed, path, client, g, t):
        return {"method": method, "seed": seed, "path": path, "client": client, "tar_global": g, "tar_tuned": t}

    evals = [ev("a", 0, 1, 1, 0.2, 0.4), ev("a", 0, 1, 2, 0.6, 0.8), ev("a", 1, 1, 1, 0.4, 0.4),  # client 2 missing once
             ev("a", 0, 1, 3, 0.5, 0.9), ev("a", 1, 1, 3, 0.1, 0.1),
             ev("b", 0, 1, 1, 0.3, 0.5), ev("b", 0, 1, 2, 0.7, 0.9), ev("b", 1, 1, 1, 0.6, 0.6),
             ev("b", 0, 1, 3, 0.5, 0.5), ev("b", 1, 1, 3, 0.2, 0.3)]
    s = Scores(evals, unseen={3})
    assert s.group("trained") == [1, 2] and s.group("unseen") == [3]
    assert s.mean("a", "tar_global", "trained") == pytest.approx(((0.2 + 0.4) / 2 + 0.6) / 2)  # client means first
    assert s.mean("a", "tar_tuned", "unseen") == pytest.approx(0.5)
    assert s.fairness("a", "tar_global", "trained") == pytest.approx((0.2 + 0.0) / 2)  # std 0.2 in run 0; one client in run 1
    a, b = s.per_run("a", "tar_global", "trained"), s.per_run("b", "tar_global", "trained")
    assert a == pytest.approx({(0, 1): 0.4, (1, 1): 0.4})
    t, w, n = paired_tests(b, a)
    assert n == 2 and t == pytest.approx(stats.ttest_rel([0.5, 0.6], [0.4, 0.4]).pvalue)


def test_a_weights_file_starts_the_backbone_and_a_bad_one_is_named(tmp_path):
    import torchvision

    source = torchvision.models.resnet18()
    torch.save(source.state_dict(), tmp_path / "r18.pt")
    model = FaceResNet(3, str(tmp_path / "r18.pt"))
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in model.backbone.state_dict().items())
    (tmp_path / "bad.pt").write_text("not a state dict")
    with pytest.raises(ValueError, match=r"bad\.pt: not a ResNet-18 state dict"):
        FaceResNet(3, str(tmp_path / "bad.pt"))
    config = FacerecExperiment.model_validate({**small_config(Path("c"), Path("cache")).model_dump(mode="json"),
                                               "train": {"weights": "r18.pt"}}).relative_to(tmp_path)
    assert config.train.weights == tmp_path / "r18.pt" and config.data.cache == tmp_path / "cache"


def test_global_testing_draws_impostors_from_the_pool_and_keeps_the_genuine_pairs():
    y = np.array([0, 0, 1, 1])  # the client's identities 0 and 1
    pool = np.array([0, 0, 1, 1, 5, 5, 6, 7])  # every client's test images; 5-7 are other clients' people
    local = sample_pairs(y, np.random.default_rng(0), 100, 400)
    genuine, impostor = sample_pairs(y, np.random.default_rng(0), 100, 400, pool=pool)
    assert np.array_equal(genuine, local[0])  # the same rng draws the genuine pairs first
    assert impostor.shape == (400, 2) and (y[impostor[:, 0]] != pool[impostor[:, 1]]).all()
    assert set(pool[impostor[:, 1]]) == {0, 1, 5, 6, 7}  # the client's other person and the other clients'
    assert np.isin(pool[impostor[:, 1]], [5, 6, 7]).mean() > 0.5  # 4 or 5 of the 6 partners are outside
    assert len(sample_pairs(y, np.random.default_rng(0), 10, 10, pool=np.array([0]))[1]) == 10  # d of identity 1
    assert len(sample_pairs(y[:2], np.random.default_rng(0), 10, 10, pool=np.array([0, 0]))[1]) == 0


def test_a_global_testing_site_holds_every_clients_test_images_as_its_impostor_pool(celeba, tmp_path):
    from fedcare.studies.facerec import data as frdata

    config = small_config(celeba, tmp_path / "cache")
    faces = frdata.load_faces(celeba, config, None)
    local = frdata.sites(faces, celeba)[1].data(Evaluation("local", 1))
    assert local.pool is None and local.identities is None  # the default: local testing
    sites = frdata.sites(faces, celeba, "global")
    data = sites[1].data(Evaluation("local", 1))
    assert torch.equal(data.x, local.x) and torch.equal(data.y, local.y)
    tests = [sites[c].data(Evaluation("global", 1)) for c in sorted(sites)]
    assert np.array_equal(data.pool.labels, torch.cat([t.y for t in tests]).numpy())  # global identities
    assert torch.equal(data.identities, tests[0].y)
    _, impostor = sample_pairs(data.identities.numpy(), np.random.default_rng(0), 50, 50, pool=data.pool.labels)
    outside = impostor[~np.isin(data.pool.labels[impostor[:, 1]], data.identities.numpy()), 1]
    assert len(outside) > 25  # client 1 has 3 of the 12 people
    drawn = data.pool.subset(outside)
    everyone = torch.cat([t.x for t in tests])
    assert torch.equal(drawn.x, everyone[outside]) and not torch.isin(drawn.y, data.identities).any()


def test_protocol_impostors_is_checked_and_named_in_one_line(tmp_path):
    from fedcare.config import ConfigError, to_toml
    from fedcare.studies.load import load_config

    config = small_config(Path("celeba"), Path("cache"))
    assert config.protocol.impostors == "local"
    text, path = to_toml(config), tmp_path / "x.toml"
    assert 'impostors = "local"' in text
    path.write_text(text.replace('impostors = "local"', 'impostors = "everyone"'))
    with pytest.raises(ConfigError, match=r"x\.toml: protocol\.impostors: .*'local' or 'global'") as error:
        load_config(path)
    assert "\n" not in str(error.value).strip()
    path.write_text(text.replace('impostors = "local"', 'impostors = "global"'))
    assert load_config(path).protocol.impostors == "global"


def test_global_testing_end_to_end_changes_only_the_impostor_side(celeba, tmp_path):
    def evals(impostors):
        config = small_config(celeba, tmp_path / "cache", methods=["fedavg"])
        config = config.model_copy(update={"protocol": config.protocol.model_copy(update={"impostors": impostors})})
        run = run_study(config, tmp_path / impostors)
        return {(r["client"], r["path"]): r for r in records(run, "client_eval")}, run

    local, _ = evals("local")
    glob, run = evals("global")
    assert local.keys() == glob.keys() and len(local) == 8
    assert all(glob[k]["genuine_pairs"] == local[k]["genuine_pairs"] for k in local)
    scored = [k for k in local if local[k]["tar_global"] is not None]
    assert scored and any(glob[k]["tar_global"] != local[k]["tar_global"] for k in scored)
    assert all(0 <= glob[k]["tar_global"] <= 1 and 0 <= glob[k]["tar_tuned"] <= 1 for k in scored)
    assert json.loads((run / "run.json").read_text())["impostors"] == "global"
    assert "any client's test split (global testing)" in (run / "report.html").read_text()


def test_paired_tests_on_too_few_pairs_are_marked_as_meaningless():
    """The demo's face report printed p = 0.030 from 2 pairs; below MIN_PAIRS every p is marked."""
    import random

    from fedcare.studies.facerec.report import MIN_PAIRS, Scores, tables

    def evals(runs: int) -> list[dict]:
        rng = random.Random(runs)
        return [{"method": m, "seed": seed, "path": 1, "client": c, "tar_global": rng.random(), "tar_tuned": rng.random()}
                for m in ("a", "b") for seed in range(runs) for c in (1, 2)]

    few = tables(Scores(evals(2), unseen=set()))["tests"]
    assert few.rows and all(row[3] == "2" and row[4].endswith("(too few pairs)") for row in few.rows)
    assert "too few pairs" in few.caption
    enough = tables(Scores(evals(MIN_PAIRS), unseen=set()))["tests"]
    assert all(row[3] == str(MIN_PAIRS) and "too few" not in row[4] + row[5] for row in enough.rows)


def test_the_thesis_orderings_are_checked_on_the_tables_numbers_with_the_paired_test():
    """Issue 29: the demo shows the thesis's orderings (claim, holds, numbers, the paired test's p)."""
    from fedcare.studies.facerec.report import Scores, orderings, paired_tests, tables

    import random

    rng = random.Random(0)  # hfmaml 0.1 above fedavg everywhere, plus noise
    evals = [{"method": m, "seed": seed, "path": path, "client": c,
              "tar_global": 0.5 + 0.05 * rng.random() + (0.1 if m == "hfmaml" else 0.0),
              "tar_tuned": 0.55 + 0.05 * rng.random() + (0.1 if m == "hfmaml" else 0.0)}
             for m in ("fedavg", "hfmaml") for seed in range(2) for path in range(1, 5) for c in (1, 2, 3)]
    s = Scores(evals, unseen={3})
    checks = {c.claim: c for c in orderings(s)}
    beats = checks["HF-MAML beats FL: hfmaml tuned > fedavg tuned (trained)"]
    assert beats.holds and beats.left == pytest.approx(s.mean("hfmaml", "tar_tuned", "trained"))
    assert beats.n == 8 and beats.p == paired_tests(s.per_run("hfmaml", "tar_tuned", "trained"),
                                                    s.per_run("fedavg", "tar_tuned", "trained"))[0]
    assert "tuning raises TAR: fedavg tuned > fedavg global (unseen)" in checks
    fair = checks["HF-MAML lowers the std across clients: hfmaml std tuned < fedavg std tuned (trained)"]
    assert fair.left == pytest.approx(s.fairness("hfmaml", "tar_tuned", "trained"))
    assert not any("-local" in claim or "fedfr" in claim for claim in checks)  # only what the run's methods show
    table = tables(s)["orderings"]
    assert table.columns[-2:] == ["p (paired t-test)", "n"] and len(table.rows) == len(checks)
    assert "orderings" not in tables(Scores([dict(e, method=e["method"] + "x") for e in evals], unseen={3}))


def test_the_printed_summary_has_table_a1_and_the_orderings(tmp_path):
    """What `fedcare demo facerec` prints after the run: Table A.1, then the orderings table."""
    from fedcare.studies.facerec.report import summary_markdown

    rows = [{"type": "client_eval", "method": m, "seed": seed, "path": 1, "client": c, "tar_global": 0.3 + 0.1 * c,
             "tar_tuned": 0.4 + 0.05 * c + 0.01 * seed + (0.1 + 0.03 * (seed == 1) if m == "hfmaml" else 0.0)}
            for m in ("fedavg", "hfmaml") for seed in range(3) for c in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run.json").write_text(json.dumps({"unseen": [2]}))
    text = summary_markdown(tmp_path)
    assert text.index("Table A.1: mean TAR@FAR") < text.index("The thesis's orderings on this run")
    assert "| HF-MAML beats FL: hfmaml tuned > fedavg tuned (trained) | 57.0 | 46.0 | yes |" in text
