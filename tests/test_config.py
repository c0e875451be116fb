from pathlib import Path

import pytest

from fedcare.config import ConfigError, to_toml

from fedcare.studies.load import load_config

MINIMAL = """
methods = ["F(C)"]
[data]
root = "unbc"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


def test_defaults_are_the_thesis_protocol_and_relative_root_resolves(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL))
    assert config.data.root == tmp_path / "unbc"
    assert config.train.lr == 1e-3 and config.train.batch_size == 32 and config.train.local_epochs == 5
    assert config.protocol.balance_per_class == 200 and config.protocol.image_size == 215
    assert config.seeds == list(range(123, 133))


def test_unknown_key_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"exp.toml: train.learning_rate: Extra inputs"):
        load_config(_write(tmp_path, MINIMAL + "[train]\nlearning_rate = 0.1\n"))


def test_mistyped_value_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"train.local_epochs"):
        load_config(_write(tmp_path, MINIMAL + "[train]\nlocal_epochs = 'five'\n"))


def test_unknown_method_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="unknown method 'FX\\(C\\)'"):
        load_config(_write(tmp_path, MINIMAL.replace("F(C)", "FX(C)")))


def test_data_needs_exactly_one_source(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of data.root"):
        load_config(_write(tmp_path, 'methods = ["BC"]\n[data]\npspi_threshold = 1\n'))


def test_set_overrides_typed_values(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL), ["train.max_rounds=3", "seeds=[1, 2]", "title=hello world"])
    assert config.train.max_rounds == 3 and config.seeds == [1, 2] and config.title == "hello world"
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(_write(tmp_path, MINIMAL), ["train.max_rounds"])


def test_missing_file_and_bad_toml_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml: no such config file"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="exp.toml: not valid TOML"):
        load_config(_write(tmp_path, "methods = [\n"))


def test_resolved_config_round_trips(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL), ["pfdl.lr_factor=5.0"])
    again = load_config(_write(tmp_path, to_toml(config)))
    assert again == config


def test_shipped_configs_validate():
    root = Path(__file__).parents[1] / "configs"
    paths = sorted(root.glob("*/*.toml"))
    assert {p.parent.name for p in paths} == {"pain", "fedhealth2", "surgical", "facerec"}
    for path in paths:
        config = load_config(path)
        assert config.study == path.parent.name
