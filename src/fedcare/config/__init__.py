"""Experiment files: TOML validated by pydantic. Unknown or mistyped keys are errors naming the key.

Every experiment names its study (`study = "pain"`, the default for files that do not say)
and is validated by that study's config model, which the study registry holds
(`fedcare.studies.load` reads a file and finds it there). What every study's config has is
`Experiment` (`experiment.py`): title, seeds, methods, `[runtime]`, `[deployment]`,
`[privacy]`, `[robustness]` and `[tracking]`, one module each; a study's `[train]` extends `Train`
(`base.py`), where the options of local training several studies have are named and typed
once. `toml.py` reads, overrides, validates and writes the files.
"""

from fedcare.config.base import (
    Aggregation,
    BatchSize,
    ConfigError,
    DataSource,
    LearningRate,
    LocalEpochs,
    ProximalMu,
    Rounds,
    Strict,
    Train,
    listed_twice,
)
from fedcare.config.deployment import SITE_NAME, Deployment, site_name_problem
from fedcare.config.experiment import Experiment, move_renamed
from fedcare.config.privacy import DPSGD, ClientDP, MembershipAudit, Privacy, PrivacyAudit, SecureAggregation
from fedcare.config.robustness import Attack, RobustRule, Robustness
from fedcare.config.runtime import DEVICE_PATTERN, Runtime
from fedcare.config.tracking import TRACKING_SCHEMES, Tracking, tracking_uri_problem
from fedcare.config.toml import (
    LAST_TABLES,
    apply_override,
    parse_toml,
    read_config,
    to_toml,
    validate,
    validation_message,
)

__all__ = [
    "Aggregation", "Attack", "BatchSize", "ClientDP", "ConfigError", "DEVICE_PATTERN", "DPSGD", "DataSource",
    "Deployment", "Experiment", "LAST_TABLES", "LearningRate", "LocalEpochs", "MembershipAudit", "Privacy",
    "PrivacyAudit", "ProximalMu", "RobustRule", "Robustness", "Rounds", "Runtime", "SITE_NAME", "SecureAggregation",
    "Strict", "TRACKING_SCHEMES", "Tracking", "Train",
    "apply_override", "listed_twice", "move_renamed", "parse_toml", "read_config", "site_name_problem", "to_toml",
    "tracking_uri_problem", "validate", "validation_message",
]
