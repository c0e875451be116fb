"""The Flower App of `flwr run` / `fedcare flower run`: a ServerApp that runs an experiment
file's study with its clients at the sites, and the ClientApp each site runs.

Run config (see `flwr_app/pyproject.toml`): `experiment` (the TOML text), `experiment-name`,
`out` (the run directory, on the coordinator), and for Flower's Simulation Engine `data-dir`
and `state-dir` (simulated nodes have no node config of their own).

Node config of a SuperNode: `site` (which site it is; see [deployment.sites]), `data-dir`
(its own data) and `state-dir` (where it keeps its private state between rounds).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedcare.config import ConfigError, PainExperiment, parse_config
from fedcare.runtime.flower.apps import DATA_DIR_KEY, PARTITION_ID_KEY, SITE_KEY, build_client_app
from fedcare.runtime.flower.link import FlowerRunError, LinkSettings, SiteLink
from fedcare.runtime.flower.site import SiteError, StudySite

server_app = ServerApp()


def link_settings(config) -> LinkSettings:
    d = config.deployment
    return LinkSettings(min_sites=d.min_sites, round_timeout=d.round_timeout, connect_timeout=d.connect_timeout)


def check_experiment(config, name: str) -> None:
    """What fails before any site is contacted."""
    if not isinstance(config, PainExperiment):
        raise ConfigError(f"{name}: the {config.study} study does not run on Flower yet (the pain study does)")
    from fedcare.studies.pain.deploy import check_deployable

    check_deployable(config, name)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    run_experiment(grid, context.run_config)


def run_experiment(grid: Grid, rc: Mapping[str, Any]) -> None:
    """The ServerApp's work: validate the experiment, greet the sites, run the study."""
    text, name = str(rc.get("experiment", "")), str(rc.get("experiment-name") or "experiment.toml")
    if not text:
        raise FlowerRunError("run config 'experiment' is empty: start runs with `fedcare flower run CONFIG`")
    if not str(rc.get("out", "")):
        raise FlowerRunError("run config 'out' is empty: the run directory to write on the coordinator")
    config = parse_config(text, name)
    check_experiment(config, name)
    from fedcare.studies.pain.deploy import FlowerRuntime
    from fedcare.studies.pain.study import run_pain_experiment

    def runtime(write):
        link = SiteLink(grid, {"experiment": text, "name": name}, link_settings(config), on_missed=write)
        link.connect(list(config.protocol.subjects))
        return FlowerRuntime(config, link)

    run_pain_experiment(config, Path(str(rc["out"])), config_file=name, runtime_factory=runtime)


_SITES: dict[tuple, StudySite] = {}  # opened sites, while this process lives: data are read once


def open_site(greeting: Mapping[str, Any], context: Context) -> StudySite:
    from fedcare.studies.pain.deploy import PainStudySite

    if "experiment" not in greeting:
        raise SiteError("this site was not greeted with an experiment (start runs with `fedcare flower run`)")
    try:
        config = parse_config(str(greeting["experiment"]), str(greeting.get("name", "experiment.toml")))
        check_experiment(config, str(greeting.get("name", "experiment")))
    except ConfigError as e:
        raise SiteError(str(e)) from None
    node, rc = context.node_config, context.run_config
    if SITE_KEY in node:
        site = str(node[SITE_KEY])
    elif PARTITION_ID_KEY in node:  # Flower's Simulation Engine: simulated site i is subject i of the protocol
        subject = config.protocol.subjects[int(node[PARTITION_ID_KEY]) % len(config.protocol.subjects)]
        names = {c: s for s, c in config.deployment.sites.items()}
        site = names.get(subject, str(subject))
    else:
        raise SiteError(f"node config names no site: start the SuperNode with --node-config '{SITE_KEY}=\"...\"'")
    data_dir = node.get(DATA_DIR_KEY) or rc.get(DATA_DIR_KEY) or config.data.root
    if not data_dir:
        raise SiteError(f"site {site!r}: no data directory: set {DATA_DIR_KEY!r} in the SuperNode's --node-config")
    key = (str(greeting["experiment"]), site, str(data_dir))
    if key not in _SITES:
        _SITES[key] = PainStudySite(config, site, Path(str(data_dir)))
    return _SITES[key]


client_app = build_client_app(open_site)
