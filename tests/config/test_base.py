"""The shared tables (fedcare.config.base): a dataset is given by exactly one of data.root and
[data.synthetic]."""

import pytest

from fedcare.config import ConfigError
from fedcare.studies.load import load_config

from support.experiment_files import write_exp


def test_data_needs_exactly_one_source(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of data.root"):
        load_config(write_exp(tmp_path, 'methods = ["BC"]\n[data]\npspi_threshold = 1\n'))
