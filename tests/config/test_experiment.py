"""What every study's experiment has (fedcare.config.experiment): a method listed twice is refused,
and a relative data root is stored resolved."""

import pytest

from fedcare.config import ConfigError, to_toml
from fedcare.studies.load import load_config

from support.experiment_files import FEDHEALTH2, MINIMAL, write_exp


def test_a_method_listed_twice_is_refused(tmp_path):
    """FedHealth 2 accepted methods = ["fedavg", "fedavg"] and reported "finished" at 5 of 10."""
    with pytest.raises(ConfigError, match=r"exp.toml: methods: Value error, fedavg listed more than once"):
        load_config(write_exp(tmp_path, FEDHEALTH2.replace('methods = ["fedprox"]', 'methods = ["fedavg", "fedavg"]')))


def test_a_relative_data_root_is_stored_resolved(tmp_path, monkeypatch):
    """`fedcare run exp.toml` (a relative config path) kept `root = "unbc"` in the run's
    config.toml, and `fedcare resume` then looked for it inside `<out>.partial`."""
    write_exp(tmp_path, MINIMAL)
    monkeypatch.chdir(tmp_path)
    config = load_config("exp.toml")
    assert config.data.root == tmp_path / "unbc" and config.data.root.is_absolute()
    assert f'root = "{tmp_path / "unbc"}"' in to_toml(config)
