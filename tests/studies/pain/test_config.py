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
