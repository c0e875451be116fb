"""The face-verification study through Flower's Simulation Engine (`run_simulation`, the
in-process backend of support/flower_inprocess.py) equals the in-process simulator bit for bit, with
local ArcFace heads of a different size at every site (each site partitions its CelebA copy
and keeps its own client's faces), with either impostor pool."""

import json

import pytest

from fedcare.data.celeba.synthetic import generate_celeba
from fedcare.studies.run import run_study

from support import records
from support.facerec import small_config
from support.flower_inprocess import run_experiment_on_flower


@pytest.mark.timeout(300)
@pytest.mark.parametrize("impostors", ["local", "global"])  # global: each site also reads every client's test crops
def test_facerec_on_flower_equals_the_simulator(tmp_path, impostors):
    root = tmp_path / "celeba"
    generate_celeba(root, seed=1, identities=14, images_per_identity=12, workers=1)
    config = small_config(root, tmp_path / "cache", methods=["hfmaml-local"])
    config = config.model_copy(update={"data": config.data.model_copy(update={"identities": 10}),  # sizes 3,3,2,2
                                       "protocol": config.protocol.model_copy(update={"impostors": impostors})})
    local = run_study(config, tmp_path / "local")
    run_experiment_on_flower(config, tmp_path / "flower", 4, "facerec.toml")
    expected = records(local, "client_eval") + records(local, "round")
    assert {r["client"] for r in expected if r["type"] == "client_eval"} == {1, 2, 3, 4}
    assert [r["clients"] for r in expected if r["type"] == "round"] == [3, 3]  # client 4 never trains
    flower = records(tmp_path / "flower", "client_eval") + records(tmp_path / "flower", "round")
    assert flower == expected  # every TAR and loss, bit for bit
    info = json.loads((tmp_path / "flower" / "run.json").read_text())
    assert info["unseen"] == [4] and info["missed"] == [] and info["impostors"] == impostors
