"""The Flower App of `flwr run` / `fedcare flower run`: a ServerApp that runs any registered
study's experiment with its clients at the sites, and the ClientApp each site runs. This is
the one place that binds studies (`fedcare.studies.registry`) to the Flower runtime
(`fedcare.runtime.flower`, which imports no study).

Run config (see `flwr_app/pyproject.toml`): `experiment` (the TOML text), `experiment-name`,
`out` (the run directory, on the coordinator), `resume` (an interrupted run's partial
directory to continue instead: `fedcare flower run --resume`), `preflight-only` (check the
sites' data summaries, write `out`/preflight.json and stop), `site-keys` (each site's public
key: a node must prove its site), and for Flower's Simulation Engine `data-dir` and
`state-dir` (simulated nodes have no node config of their own).

Node config of a SuperNode: `site` (which site it is; see [deployment.sites]), `data-dir`
(its own data), `state-dir` (where it keeps its private state between rounds) and
`preflight-min-count` (its data summary's suppression threshold, default 5).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# OpenCV's loader puts back a copy of sys.path taken before it ran (cv2/__init__.py), dropping
# what another thread added meanwhile. On Flower's Simulation Engine the main thread imports Ray
# as soon as this module is loaded, and Ray adds its vendored packages (colorama, psutil) to
# sys.path, while the ServerApp thread imports the study and its data modules (cv2): loaded
# there, OpenCV could erase Ray's entry in mid-import (ModuleNotFoundError: colorama). Loaded
# here, it is done before Flower starts Ray (Flower loads the app before its Ray backend).
import cv2  # noqa: F401
import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from pydantic import ValidationError

from fedcare.algorithms.base import ClientId
from fedcare.config import ConfigError, Experiment, Runtime
from fedcare.data.common import DataError
from fedcare.files import atomic_write_text
from fedcare.runtime.flower.client_app import (
    DATA_DIR_KEY, PARTITION_ID_KEY, RUN_KEY, SITE_KEY, STATE_DIR_KEY, build_client_app,
)
from fedcare.runtime.flower.link import FlowerRunError, LinkSettings, SiteLink
from fedcare.runtime.flower.runtime import FlowerRuntime
from fedcare.runtime.preflight import Preflight, check_sites, refuse
from fedcare.runtime.sites import Site, SiteError
from fedcare.studies import registry
from fedcare.studies.base import Records, Study
from fedcare.studies.compose import Composed
from fedcare.studies.load import parse_config
from fedcare.studies.run import resume_study, run_study
from fedcare.studies.rundir import read_run_info, read_run_records, set_threads

server_app = ServerApp()


def link_settings(config: Experiment, sites: int) -> LinkSettings:
    """The link's settings for an experiment of `sites` sites."""
    d = config.deployment
    return LinkSettings(min_sites=d.quorum(sites), round_timeout=d.round_timeout, connect_timeout=d.connect_timeout,
                        late_sites=d.late_sites)


def listed_sites(study: Study) -> dict[str, ClientId]:
    """The sites a run across sites expects, name -> client: `[deployment.sites]`, else each
    client's id as its site's name."""
    names = {c: s for s, c in study.config.deployment.sites.items()}
    return {names.get(c, str(c)): c for c in study.clients()}


def check_experiment(config: Experiment, name: str) -> Study:
    """What fails before any site is contacted; returns the study bound to the experiment."""
    if config.robustness is not None and config.robustness.attack is not None:
        raise ConfigError(f"{name}: robustness.attack simulates attackers in process (fedcare run); a deployed site "
                          "runs its own code, so it is not sent to sites: remove [robustness.attack]")
    study = registry.study_for(config)
    study.check_deployable(name)
    return study


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    run_experiment(grid, context.run_config)


def run_experiment(grid: Grid, rc: Mapping[str, Any]) -> None:
    """The ServerApp's work: validate the experiment, greet the sites, run the study; or, with
    `resume` (an interrupted run's partial directory), continue that run across the sites."""
    resume = str(rc.get("resume", ""))
    if resume:
        partial = Path(resume)
        try:
            text = (partial / "config.toml").read_text()
        except OSError as e:
            raise FlowerRunError(f"{partial}: no run to resume here ({e.strerror or e})") from None
        info = read_run_info(partial)[0]
        name, run_key = str(info.get("config_file") or "experiment.toml"), str(info.get("flower_run") or "")
        if not run_key:
            raise FlowerRunError(f"{partial}: not a run across sites (run.json names no flower_run)")
    else:
        text, name = str(rc.get("experiment", "")), str(rc.get("experiment-name") or "experiment.toml")
        run_key = secrets.token_hex(8)
        if not text:
            raise FlowerRunError("run config 'experiment' is empty: start runs with `fedcare flower run CONFIG`")
        if not str(rc.get("out", "")):
            raise FlowerRunError("run config 'out' is empty: the run directory to write on the coordinator")
    config = parse_config(text, name)
    study = check_experiment(config, name)
    keys = str(rc.get("site-keys", ""))
    site_keys = json.loads(keys) if keys else None  # {site: its public key}: each node must prove its site
    if str(rc.get(PREFLIGHT_ONLY_KEY, "")).lower() in ("1", "true", "yes"):
        sites = listed_sites(study)
        link = SiteLink(grid, {"experiment": text, "name": name, RUN_KEY: run_key},
                        link_settings(config, len(sites)), site_keys=site_keys, sites=sites)
        link.connect()
        preflight = check_sites(link, study.preflight_expectations())
        # a check of the sites is a check of every listed site: one that is not there fails it
        preflight.problems += [f"site {link.site_name(c)!r} ({c}) is missing: {why}" for c, why in link.absent().items()]
        write_preflight(preflight, Path(str(rc["out"])))
        return

    def runtime(study: Study, write: Records) -> FlowerRuntime:
        sites = listed_sites(study)
        link = SiteLink(grid, {"experiment": text, "name": name, RUN_KEY: run_key},
                        link_settings(config, len(sites)), on_missed=write, on_participation=write,
                        site_keys=site_keys, sites=sites)
        if resume:  # what happened before the checkpoint is in its records: the report counts it too
            before = read_run_records(partial)[0]
            link.missed = [r for r in before if r.get("type") == "missed"]
            link.participation = [r for r in before if r.get("type") == "participation"]
            link.refused = [r for r in before if r.get("type") == "refused"]
        link.connect()  # a listed site that is not there is recorded, and the run is not complete
        preflight = check_sites(link, study.preflight_expectations())
        refuse(preflight)  # before any training: a site without what the experiment needs stops the run here
        return FlowerRuntime(link, study.composed.algorithm, run_key, preflight)

    if resume:
        resume_study(partial, runtime_factory=runtime)
    else:
        run_study(config, Path(str(rc["out"])), config_file=name, runtime_factory=runtime)


PREFLIGHT_ONLY_KEY = "preflight-only"  # run config: greet the sites, check their data, write preflight.json, stop
PREFLIGHT_FILE = "preflight.json"


def write_preflight(preflight: Preflight, out: Path) -> None:
    """`fedcare flower run --preflight-only`: the check into `out`/preflight.json (on the
    coordinator), then stop; a failed check fails the run, naming each site and problem."""
    out.mkdir(parents=True, exist_ok=False)
    atomic_write_text(out / PREFLIGHT_FILE, json.dumps(preflight.as_json(), indent=2) + "\n")
    refuse(preflight)


DEVICE_KEY = "device"  # node config: the device this site computes on (`fedcare flower supernode --device`)


def site_device(config: Experiment, device: object) -> Experiment:
    """The experiment with a site's own `[runtime] device` (the SuperNode's --device), if it set one."""
    if not device:
        return config
    try:
        runtime = Runtime.model_validate({**config.runtime.model_dump(), "device": str(device)})
    except ValidationError as e:
        raise ConfigError(f"node config {DEVICE_KEY}: {e.errors()[0]['msg']}") from None
    return config.model_copy(update={"runtime": runtime})


_SITES: dict[tuple, tuple[Site, Composed]] = {}  # opened sites, while this process lives: data are read once


def open_site(greeting: Mapping[str, Any], context: Context) -> tuple[Site, Composed]:
    """The site this node is, for the experiment it was greeted with: its data and the study's
    model and algorithms with the experiment's stack (`Study.composed`: what the coordinator
    builds too). Fails naming the site and the problem."""
    if "experiment" not in greeting:
        raise SiteError("this site was not greeted with an experiment (start runs with `fedcare flower run`)")
    name = str(greeting.get("name", "experiment.toml"))
    node, rc = context.node_config, context.run_config
    try:
        config = site_device(parse_config(str(greeting["experiment"]), name), node.get(DEVICE_KEY))
        study = check_experiment(config, name)
        study.compute.apply()  # this site's device: a ConfigError here if the machine does not have it
    except (ConfigError, registry.UnknownStudy) as e:
        raise SiteError(str(e)) from None
    if SITE_KEY in node:
        site = str(node[SITE_KEY])
    elif PARTITION_ID_KEY in node:  # Flower's Simulation Engine: simulated site i is the protocol's client i
        clients = study.clients()
        client = clients[int(node[PARTITION_ID_KEY]) % len(clients)]
        names = {c: s for s, c in config.deployment.sites.items()}
        site = names.get(client, str(client))
    else:
        raise SiteError(f"node config names no site: start the SuperNode with --node-config '{SITE_KEY}=\"...\"'")
    data_dir = node.get(DATA_DIR_KEY) or rc.get(DATA_DIR_KEY) or getattr(getattr(config, "data", None), "root", None)
    if not data_dir:
        raise SiteError(f"site {site!r}: no data directory: set {DATA_DIR_KEY!r} in the SuperNode's --node-config")
    set_threads(config)  # torch's float sums depend on the thread count: the server's runs use it too
    key = (str(greeting["experiment"]), site, str(data_dir))
    if key not in _SITES:
        try:
            _SITES[key] = (study.open_site(site, Path(str(data_dir)), _site_cache(context)), study.composed)
        except DataError as e:
            raise SiteError(f"site {site!r}: {e}") from None
    return _SITES[key]


def _site_cache(context: Context) -> Path | None:
    """The site's own cache folder: `<state-dir>/cache` from its SuperNode's --state-dir (the
    Simulation Engine's run config), else None (the user's cache); never the experiment's."""
    state_dir = context.node_config.get(STATE_DIR_KEY) or context.run_config.get(STATE_DIR_KEY)
    return Path(str(state_dir)) / "cache" if state_dir else None


client_app = build_client_app(open_site)
