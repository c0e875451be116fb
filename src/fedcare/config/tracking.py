"""`[tracking]`: where a run is logged while it runs (MLflow), besides its run directory."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from fedcare.config.base import Strict

# the stores MLflow's client reaches: a local database (sqlite:///path), a file store (a path,
# file:///path), a tracking server (http(s)://host:port), a SQL database MLflow supports
# (postgresql://, mysql://, mssql://, each optionally "+driver"), Databricks
TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")


class Tracking(Strict):
    """`[tracking]`: `mlflow` is the tracking URI the run logs to (docs/runs.md#tracking):
    params, metrics per round and per client, tags, and at the end the report and tables as
    artifacts. A relative path is relative to the folder the run is started from, as in
    MLflow. `experiment`: the MLflow experiment (default "fedcare-<study>")."""

    mlflow: str = Field(min_length=1)
    experiment: str | None = Field(None, min_length=1, max_length=500)

    @field_validator("mlflow")
    @classmethod
    def _uri(cls, uri: str) -> str:
        problem = tracking_uri_problem(uri)
        if problem:
            raise ValueError(problem)
        return uri


def tracking_uri_problem(uri: str) -> str | None:
    """Why `uri` cannot be an MLflow tracking URI (None: it can); checked before any training."""
    if uri != uri.strip() or any(c in uri for c in "\n\r\t"):
        return f"{uri!r}: spaces or line breaks around or in the URI"
    if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", uri) or re.match(r"^[A-Za-z]:[\\/]", uri):
        return None  # a path (a Windows drive letter too): MLflow's file store
    parts = urlsplit(uri)
    scheme = parts.scheme.lower().split("+")[0]
    if scheme not in TRACKING_SCHEMES:
        return (f"{uri!r}: unknown scheme {parts.scheme!r}; use sqlite:///path/mlflow.db, a folder, "
                f"http(s)://host:port or one of {', '.join(TRACKING_SCHEMES)}")
    if parts.password is not None:
        return (f"{parts.scheme}://...: credentials in the URI; set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead: the experiment file is copied into "
                "every run directory")
    if scheme == "sqlite" and (not uri.lower().startswith("sqlite:///") or len(uri) == len("sqlite:///")):
        return f"{uri!r}: a SQLite database is sqlite:///relative/path.db or sqlite:////absolute/path.db"
    if scheme in ("http", "https") and not parts.hostname:
        return f"{uri!r}: no host; a tracking server is http(s)://host:port"
    return None
