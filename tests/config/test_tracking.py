"""`[tracking]` (fedcare.config.tracking): a tracking URI MLflow can reach is taken as written; a
mistyped one is a one-line error naming tracking.mlflow before anything runs, and so are
credentials written into the experiment file (it is copied into every run directory)."""

import pytest

from fedcare.config import ConfigError
from fedcare.studies.load import load_config

from support.experiment_files import MINIMAL, write_exp


@pytest.mark.parametrize("uri", ["sqlite:///mlflow.db", "sqlite:////srv/mlflow/mlflow.db", "mlruns", "/srv/mlruns",
                                 "file:///srv/mlruns", "http://mlflow.hospital.org:5000", "https://mlflow.example",
                                 "postgresql+psycopg2://mlflow@db.local/mlflow", "databricks"])
def test_a_tracking_uri_mlflow_reaches_is_taken_as_written(tmp_path, uri):
    config = load_config(write_exp(tmp_path, MINIMAL), [f'tracking.mlflow="{uri}"'])
    assert config.tracking.mlflow == uri and config.tracking.experiment is None


@pytest.mark.parametrize("uri, said", [
    ("sqlte:///mlflow.db", "unknown scheme 'sqlte'"),
    ("sqlite://mlflow.db", "a SQLite database is sqlite:///relative/path.db"),
    ("sqlite:///", "a SQLite database is sqlite:///relative/path.db"),
    ("http://:5000", "no host"),
    ("https://admin:secret@mlflow.example", "credentials in the URI; set MLFLOW_TRACKING_USERNAME"),
    (" sqlite:///mlflow.db", "spaces or line breaks"),
])
def test_a_bad_tracking_uri_is_one_line_naming_the_key(tmp_path, uri, said):
    with pytest.raises(ConfigError) as error:
        load_config(write_exp(tmp_path, f'{MINIMAL}[tracking]\nmlflow = "{uri}"\n'))
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'exp.toml'}: tracking.mlflow: ") and said in message and "\n" not in message
    assert "secret" not in message  # a password read from the file is not repeated


def test_the_tracking_table_needs_its_uri_and_knows_its_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"tracking.mlflow: missing"):
        load_config(write_exp(tmp_path, MINIMAL), ['tracking.experiment="icu"'])
    with pytest.raises(ConfigError, match=r"tracking.experimnet: unknown key; did you mean tracking.experiment\?"):
        load_config(write_exp(tmp_path, MINIMAL), ['tracking.mlflow="mlruns"', 'tracking.experimnet="icu"'])
    assert load_config(write_exp(tmp_path, MINIMAL)).tracking is None  # no table: nothing is tracked
