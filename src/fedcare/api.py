"""fedcare's public API: everything a study, a dataset or an algorithm in another package needs,
from one module (`from fedcare.api import RoundsStudy, ClientData, ...`). docs/api.md says
what each name is; a name here keeps its meaning within a release series, whereas fedcare's
internal modules may move.

The names that build reports (tables, plots, the page) are imported when first used, so a
study's package that imports this module does not load matplotlib at a Flower site.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedcare.algorithms import Algorithm, ClientHalf, ClientState, Message, ServerHalf
from fedcare.algorithms.base import ClientId
from fedcare.algorithms.catalogue import build as build_algorithm
from fedcare.algorithms.catalogue import names as algorithm_names
from fedcare.algorithms.split import SHARE_ALL, ParameterSplit
from fedcare.algorithms.training import SGD, AdamW, TrainSettings
from fedcare.client_data import ClientData
from fedcare.config import (
    Aggregation, BatchSize, ConfigError, DataSource, Experiment, LearningRate, LocalEpochs, ProximalMu, Strict, Train,
)
from fedcare.data.common import SYNTHETIC_MARKER, DataError
from fedcare.data.synthetic.output import atomic_directory
from fedcare.errors import InputError, UserError
from fedcare.runtime.federation import Federation
from fedcare.runtime.local import LocalRuntime
from fedcare.runtime.refs import DataRef, SeededSplit, Split
from fedcare.runtime.sites import Site, SiteError
from fedcare.seeding import derive_seed, numpy_rng, torch_generator
from fedcare.studies.base import Study, StudyProtocol, StudyRuntime
from fedcare.studies.load import load_config
from fedcare.studies.rounds import (
    SINGLE_SITE, RoundsExperiment, RoundsOptions, RoundsProtocol, RoundsStudy, RoundsTrain, data_ref, parse_data_ref,
)
from fedcare.studies.run import resume_study, run_study
from fedcare.tasks import BINARY, MULTICLASS, EmbeddingTask, MultilabelTask, Task

if TYPE_CHECKING:
    from fedcare.report import write_report
    from fedcare.report.html import render_run_page, table_block
    from fedcare.report.plots import method_bars, method_lines
    from fedcare.report.tables import Table, pct, pct_pm
    from fedcare.runfiles import read_run_info, read_run_records

# name -> the module that defines it, imported on first use (the report stack)
_LATER = {
    "write_report": "fedcare.report", "render_run_page": "fedcare.report.html", "table_block": "fedcare.report.html",
    "method_bars": "fedcare.report.plots", "method_lines": "fedcare.report.plots", "Table": "fedcare.report.tables",
    "pct": "fedcare.report.tables", "pct_pm": "fedcare.report.tables", "read_run_info": "fedcare.runfiles",
    "read_run_records": "fedcare.runfiles",
}


def __getattr__(name: str) -> Any:
    if name in _LATER:
        return getattr(importlib.import_module(_LATER[name]), name)
    raise AttributeError(f"module 'fedcare.api' has no attribute {name!r}")


__all__ = [
    # studies
    "Study", "StudyProtocol", "StudyRuntime", "RoundsStudy", "RoundsProtocol", "RoundsExperiment", "RoundsTrain",
    "RoundsOptions", "SINGLE_SITE", "data_ref", "parse_data_ref", "run_study", "resume_study", "load_config",
    # experiment files
    "Experiment", "Train", "Strict", "DataSource", "ConfigError", "LearningRate", "BatchSize", "LocalEpochs",
    "Aggregation", "ProximalMu",
    # data and sites
    "ClientData", "ClientId", "Site", "SiteError", "DataRef", "SeededSplit", "Split", "DataError", "SYNTHETIC_MARKER",
    "atomic_directory",
    # errors
    "UserError", "InputError",
    "LocalRuntime", "Federation",
    # tasks and training
    "Task", "BINARY", "MULTICLASS", "MultilabelTask", "EmbeddingTask", "TrainSettings", "SGD", "AdamW",
    # algorithms
    "Algorithm", "ClientHalf", "ServerHalf", "Message", "ClientState", "ParameterSplit", "SHARE_ALL",
    "build_algorithm", "algorithm_names",
    # randomness
    "derive_seed", "numpy_rng", "torch_generator",
    # reports
    "read_run_info", "read_run_records", "Table", "pct", "pct_pm", "method_lines", "method_bars", "table_block",
    "render_run_page", "write_report",
]
