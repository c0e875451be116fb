"""The face-verification study (Hess) on synthetic CelebA: a small run end to end in which the
unseen clients never receive a training message, bad input named in one line, a weights file for
the backbone, and global testing (impostors from every client's test split)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcare.evaluation.verification import sample_pairs
from fedcare.models.face_resnet import FaceResNet
from fedcare.runtime.clients import LocalClients
from fedcare.studies.facerec.config import FacerecExperiment
from fedcare.studies.facerec.data import Evaluation
from fedcare.studies.run import run_study

from support import records
from support.facerec import small_config
from support.lineage import check_lineage


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
    aggregates = [r for r in check_lineage(run).records if r["type"] == "aggregate"]
    assert {c for r in aggregates for c in r["clients"]} == {"1", "2", "3"}  # the unseen client is in no model


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
