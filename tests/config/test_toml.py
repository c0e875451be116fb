"""Experiment files as text (fedcare.config.toml): unknown or mistyped keys named (with the nearest
key for a --set), --set overrides, missing or bad files named, the resolved config written back
and read again, the shipped configs valid, and the renamed options read under their old names."""

import pytest

from fedcare.config import ConfigError, to_toml
from fedcare.studies import registry
from fedcare.studies.load import load_config

from support import ROOT
from support.experiment_files import FEDHEALTH2, MINIMAL, write_exp


def test_unknown_key_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"exp.toml: train.learning_rate: unknown key; known keys here: .*\blr\b"):
        load_config(write_exp(tmp_path, MINIMAL + "[train]\nlearning_rate = 0.1\n"))


def test_mistyped_value_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"train.local_epochs"):
        load_config(write_exp(tmp_path, MINIMAL + "[train]\nlocal_epochs = 'five'\n"))


def test_set_overrides_typed_values(tmp_path):
    config = load_config(write_exp(tmp_path, MINIMAL), ["train.rounds=3", "seeds=[1, 2]", "title=hello world"])
    assert config.train.rounds == 3 and config.seeds == [1, 2] and config.title == "hello world"
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(write_exp(tmp_path, MINIMAL), ["train.rounds"])


def test_missing_file_and_bad_toml_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml: no such config file"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="exp.toml: not valid TOML"):
        load_config(write_exp(tmp_path, "methods = [\n"))


def test_resolved_config_round_trips(tmp_path):
    config = load_config(write_exp(tmp_path, MINIMAL), ["pfdl.lr_factor=5.0"])
    again = load_config(write_exp(tmp_path, to_toml(config)))
    assert again == config


def test_shipped_configs_validate():
    root = ROOT / "configs"
    paths = sorted(root.glob("*/*.toml"))
    assert {p.parent.name for p in paths} == set(registry.BUILT_IN)  # every built-in study ships its configs
    for path in paths:
        config = load_config(path)
        assert config.study == path.parent.name


def test_a_bad_set_key_is_named_as_given_with_the_nearest_key(tmp_path):
    """Not the packaged file in pydantic's words: the `--set` it came from and the key meant."""
    path = write_exp(tmp_path, MINIMAL)
    with pytest.raises(ConfigError) as e:
        load_config(path, ["train.round=3"])
    assert str(e.value) == "--set train.round=3: train.round: unknown key; did you mean train.rounds?"
    with pytest.raises(ConfigError) as e:
        load_config(path, ["trian.lr=0.1"])
    assert str(e.value) == "--set trian.lr=0.1: trian: unknown key; did you mean train?"


def test_a_list_given_as_a_scalar_shows_the_list_form(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(write_exp(tmp_path, MINIMAL), ["seeds=1"])
    assert str(e.value) == "--set seeds=1: seeds: expected a list, e.g. seeds = [1]"
    with pytest.raises(ConfigError, match=r"exp.toml: methods: expected a list, e.g. methods = \[\"BC\"\]"):
        load_config(write_exp(tmp_path, 'methods = "BC"\n[data]\nroot = "unbc"\n'))


# -- one vocabulary: the renamed options -----------------------------------------------------
def test_an_old_option_name_loads_with_a_warning_naming_both_and_the_same_value(tmp_path, caplog):
    new = load_config(write_exp(tmp_path, FEDHEALTH2 + "[train]\nmu = 0.005\n"))
    with caplog.at_level("WARNING", logger="fedcare.config"):
        old = load_config(write_exp(tmp_path, FEDHEALTH2 + "[options]\nfedprox_mu = 0.005\nfedap_lambda = 0.25\n"))
    assert old.train.mu == new.train.mu == 0.005 and old.options.fedap_lambda == 0.25
    assert old == new.model_copy(update={"options": old.options})
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'exp.toml'}: options.fedprox_mu is now called train.mu; the old name is read until the next release"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="fedcare.config"):  # --set takes the old name too
        assert load_config(write_exp(tmp_path, FEDHEALTH2), ["options.fedprox_mu=0.02"]).train.mu == 0.02
    assert "options.fedprox_mu is now called train.mu" in caplog.text


def test_an_option_under_its_old_and_its_new_name_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"exp.toml: .*options.fedprox_mu and train.mu are one option .*give train.mu "
                                          r"only"):
        load_config(write_exp(tmp_path, FEDHEALTH2 + "[train]\nmu = 0.1\n[options]\nfedprox_mu = 0.1\n"))


@pytest.mark.parametrize("table, key", [("train", "fedprox_mu"), ("options", "mu"), ("train", "learning_rate")])
def test_unknown_keys_are_still_errors_naming_the_key(tmp_path, table, key):
    with pytest.raises(ConfigError, match=rf"exp.toml: {table}.{key}: unknown key"):
        load_config(write_exp(tmp_path, FEDHEALTH2 + f"[{table}]\n{key} = 0.1\n"))


def _with_old_names(raw: dict, renamed: dict[str, str]) -> dict:
    """`raw` (a shipped config, new names) written with the old names instead."""
    for old, new in renamed.items():
        *new_tables, new_key = new.split(".")
        *old_tables, old_key = old.split(".")
        node = raw
        for table in new_tables:
            node = node.get(table, {})
        if new_key in node:
            value = node.pop(new_key)
            target = raw
            for table in old_tables:
                target = target.setdefault(table, {})
            target[old_key] = value
    return raw


def test_every_shipped_config_written_with_the_old_names_resolves_to_the_same_values():
    import tomllib

    from fedcare.config import validate

    renamed_some = 0
    for path in sorted((ROOT / "configs").glob("*/*.toml")):
        config = load_config(path)
        raw = tomllib.loads(path.read_text())
        old = _with_old_names(raw, type(config).renamed)
        renamed_some += old != tomllib.loads(path.read_text())
        assert validate(type(config), old, path) == config, path
    assert renamed_some >= 2  # fedhealth2's pamap2 and xray configs give FedProx's mu


def test_an_old_name_beside_a_new_table_that_is_not_a_table_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"exp.toml: train: Input should be a valid dictionary"):
        load_config(write_exp(tmp_path, 'train = 3\n' + FEDHEALTH2 + "[options]\nfedprox_mu = 0.1\n"))


@pytest.mark.timeout(30)
def test_a_config_that_is_no_regular_file_or_far_too_large_is_refused_naming_it(tmp_path):
    """A FIFO blocked the read for ever; /dev/zero was read until memory ran out."""
    import os

    fifo = tmp_path / "exp.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"exp.fifo: not a regular file"):
        load_config(fifo)
    with pytest.raises(ConfigError, match=r"/dev/zero: not a regular file"):
        load_config("/dev/zero")
    huge = tmp_path / "huge.toml"
    huge.write_text(MINIMAL + "# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match=r"huge.toml: larger than 1 MiB"):
        load_config(huge)


def test_a_utf8_byte_order_mark_is_read_as_some_editors_write_it(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_bytes(b"\xef\xbb\xbf" + (MINIMAL + "[train]\nrounds = 4\n").encode())
    assert load_config(path).train.rounds == 4


@pytest.mark.parametrize("assignment", ["=5", ".rounds=5", "train.=5", " =5"])
def test_a_set_without_a_key_is_blamed_on_the_set(tmp_path, assignment):
    """`--set =5` gave 'exp.toml: : unknown key', blaming the file."""
    with pytest.raises(ConfigError, match=r"--set .*expected a dotted key before '='"):
        load_config(write_exp(tmp_path, MINIMAL), [assignment])
