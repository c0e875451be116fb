"""One name per idea across the studies' experiment files: every study says `train.rounds` for
the rounds a federation trains (the pain study: the most a phase trains, with `patience`), and
the old names still load, with a warning naming both, as the same experiment."""

import logging
import tomllib

import pytest

from fedcare.config import ConfigError
from fedcare.studies import registry
from fedcare.studies.load import load_config

OLD_NAMES = {"pain": {"train.max_rounds", "train.pretrain_max_rounds"}, "fedhealth2": {"train.pretrain_epochs"},
             "facerec": {"protocol.rounds"}, "privacy_audit": {"protocol.rounds"}, "surgical": set()}


def _set(raw: dict, key: str, value) -> None:
    *tables, name = key.split(".")
    for table in tables:
        raw = raw.setdefault(table, {})
    raw[name] = value


def _pop(raw: dict, key: str) -> None:
    *tables, name = key.split(".")
    for table in tables:
        raw = raw.get(table, {})
    raw.pop(name, None)


@pytest.mark.parametrize("name", sorted(registry.BUILT_IN))
def test_every_study_says_train_rounds(name):
    study = registry.get(name)
    assert "rounds" in study.config_model.model_fields["train"].annotation.model_fields
    assert {old for old, new in study.config_model.renamed.items() if new.endswith("rounds")} == OLD_NAMES[name]


RENAMED = [(name, old, new) for name in sorted(registry.BUILT_IN)
           for old, new in registry.get(name).config_model.renamed.items() if old in OLD_NAMES[name]]


@pytest.mark.parametrize("name, old, new", RENAMED, ids=[f"{n}:{o}" for n, o, _ in RENAMED])
def test_an_old_rounds_name_loads_with_a_warning_as_the_same_experiment(name, old, new, caplog):
    study = registry.get(name)
    with open(study.demo_config(), "rb") as f:
        demo = tomllib.load(f)
    _pop(demo, new)
    by_old, by_new = (dict(demo, **{t: dict(v) for t, v in demo.items() if isinstance(v, dict)}) for _ in range(2))
    _set(by_old, old, 2)
    _set(by_new, new, 2)
    with caplog.at_level(logging.WARNING, logger="fedcare.config"):
        config = study.config_model.model_validate(by_old, context={"source": "exp.toml"})
    assert f"exp.toml: {old} is now called {new}; the old name is read until the next release" in caplog.text
    assert config == study.config_model.model_validate(by_new)
    assert config.model_dump()[new.split(".")[0]][new.split(".")[1]] == 2


def test_set_with_the_old_name_on_a_file_with_the_new_one_says_to_give_the_new_name_only():
    demo = registry.get("pain").demo_config()
    assert load_config(demo, ["train.rounds=3"]).train.rounds == 3
    with pytest.raises(ConfigError, match=r"train\.max_rounds and train\.rounds are one option .*: give train\.rounds only"):
        load_config(demo, ["train.max_rounds=3"])
