"""The face study's experiment (fedcare.studies.facerec.config): fewer identities than clients is
refused."""

import pytest

from fedcare.config import ConfigError
from fedcare.studies.load import load_config

from support.experiment_files import write_exp


def test_face_verification_with_fewer_identities_than_clients_is_refused(tmp_path):
    """It ran with empty clients and an all-NA table."""
    text = ('study = "facerec"\nmethods = ["fedavg"]\n[data]\nidentities = 10\nclients = 12\n'
            '[data.synthetic]\nidentities = 30\n[protocol]\nunseen = [12]\n')
    with pytest.raises(ConfigError, match=r"data.identities = 10 is fewer than data.clients = 12"):
        load_config(write_exp(tmp_path, text))
    with pytest.raises(ConfigError, match=r"data.synthetic.identities = 8 is fewer than data.clients = 12"):
        load_config(write_exp(tmp_path, text.replace("identities = 10", "identities = 40").replace("identities = 30", "identities = 8")))
