"""The pain study's experiment (fedcare.studies.pain.config): its defaults are the thesis's
protocol, and an unknown method is refused by name."""

import pytest

from fedcare.config import ConfigError
from fedcare.studies.load import load_config

from support.experiment_files import MINIMAL, write_exp


def test_defaults_are_the_thesis_protocol_and_relative_root_resolves(tmp_path):
    config = load_config(write_exp(tmp_path, MINIMAL))
    assert config.data.root == tmp_path / "unbc"
    assert config.train.lr == 1e-3 and config.train.batch_size == 32 and config.train.local_epochs == 5
    assert config.protocol.balance_per_class == 200 and config.protocol.image_size == 215
    assert config.seeds == list(range(123, 133))


def test_unknown_method_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="unknown method 'FX\\(C\\)'"):
        load_config(write_exp(tmp_path, MINIMAL.replace("F(C)", "FX(C)")))


@pytest.mark.parametrize("example", ["sites.toml", "sites-trial.toml"])
def test_the_deployment_examples_run_in_process_on_their_own_subjects(tmp_path, example):
    """`fedcare run` takes the deployment examples on a copy that holds only their sites'
    subjects (fedcare 0.2's sites.toml also read the thesis's Group-1 pretraining subjects,
    which none of its methods uses: "subject 42 not found")."""
    from fedcare.data.unbc.synthetic import generate_pain_cohort
    from fedcare.studies import registry

    from support import ROOT

    generate_pain_cohort(tmp_path / "unbc", subjects=[43, 48, 52], frame_scale=0.02, image_size=32)
    config = load_config(ROOT / "configs" / "pain" / example, [f"data.root={tmp_path / 'unbc'}"])
    (tmp_path / "work").mkdir()  # the run directory, which run_study makes
    runtime = registry.study_for(config).local_runtime(tmp_path / "work", None)
    assert sorted(runtime.sites) == [43, 48, 52] == sorted(config.deployment.sites.values())
