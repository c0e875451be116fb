"""`[privacy]`'s bounds (`fedcare.config.privacy`): every value can finish and be accounted for.
A noise multiplier of 1e300 overflowed the noise and the accountant (epsilon came out infinite
for the most noise); a target_epsilon of 1e308 left Opacus's calibration searching for ever.
Each is refused when the file is read, naming the key; 0 noise (clipping only) stays allowed."""

from __future__ import annotations

import pytest

from fedcare.config import ConfigError
from fedcare.studies.load import load_config

from support import ROOT

CONFIG = ROOT / "configs" / "fedhealth2" / "demo.toml"


@pytest.mark.parametrize("settings, key", [
    (["privacy.dp_sgd.noise_multiplier=1e300"], "privacy.dp_sgd.noise_multiplier"),
    (["privacy.client_dp.noise_multiplier=1e300"], "privacy.client_dp.noise_multiplier"),
    (["privacy.dp_sgd.target_epsilon=1e308", "privacy.dp_sgd.budget_epochs=2"], "privacy.dp_sgd.target_epsilon"),
    (["privacy.client_dp.target_epsilon=1e308", "privacy.client_dp.budget_rounds=3"],
     "privacy.client_dp.target_epsilon"),
    (["privacy.dp_sgd.target_epsilon=1", "privacy.dp_sgd.budget_epochs=1e300"], "privacy.dp_sgd.budget_epochs"),
    (["privacy.client_dp.target_epsilon=1", f"privacy.client_dp.budget_rounds={2 ** 62}"],
     "privacy.client_dp.budget_rounds"),
])
def test_values_past_their_bounds_are_refused_naming_the_key(settings, key):
    with pytest.raises(ConfigError, match=f"{key.replace('.', '[.]')}: Input should be less than or equal to"):
        load_config(CONFIG, settings)


@pytest.mark.parametrize("table", ["dp_sgd", "client_dp"])
def test_no_noise_stays_allowed(table):
    """noise_multiplier = 0 is documented: clipping only, epsilon infinite (no guarantee)."""
    config = load_config(CONFIG, [f"privacy.{table}.noise_multiplier=0"])
    assert getattr(config.privacy, table).noise_multiplier == 0
