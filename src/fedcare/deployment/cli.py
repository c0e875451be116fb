"""`fedcare flower ...`: the three roles of a deployment.

- coordinator: `fedcare flower certs` (CA, SuperLink certificate, site keys) and
  `fedcare flower superlink` (Flower's SuperLink with TLS, SuperNode authentication and no
  run-time dependency installation, which fails offline);
- site: `fedcare flower supernode` (a SuperNode told which site it is, where its data and
  its state live, with `fedcare flower clientapps`, the warm launcher that answers its
  messages in processes forked from one that imported Flower, torch and the app once);
- researcher: `fedcare flower run` (validates the experiment, starts it with `flwr run`,
  waits for it, and fails loudly unless it completed: `flwr run` itself exits 0 even when
  the run failed).

The superlink and supernode commands check their inputs, then replace themselves with
Flower's own command (shown with --dry-run), so signals (Ctrl-C, SIGTERM) reach Flower; the
supernode command first starts the warm launcher, which ends with the SuperNode.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

flower_app = typer.Typer(help="Run experiments across sites on Flower: coordinator, site and researcher commands.",
                         no_args_is_help=True)
console = Console(stderr=True)

FINISHED_OK = "finished:completed"


def put_flower_commands_on_path() -> None:
    """Flower's commands (`flwr`, `flower-superlink`, `flower-supernode` and the ones they start
    themselves) are installed beside this interpreter: put that folder first on PATH, so that
    `.venv/bin/fedcare flower ...` works in an environment that was never activated."""
    scripts = sysconfig.get_path("scripts")
    path = os.environ.get("PATH", "")
    if scripts not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, path]) if path else scripts


@flower_app.callback()
def _flower_commands() -> None:
    put_flower_commands_on_path()


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


# Flower's SuperExec (started by the SuperLink, and by a SuperNode without the warm launcher)
# looks for work every second by default; this environment variable is Flower's own setting.
SUPEREXEC_POLL = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}


def _exec(cmd: list[str], dry_run: bool, env: dict[str, str] | None = None) -> None:
    env = {k: v for k, v in (env or {}).items() if k not in os.environ}  # the user's own setting wins
    if dry_run:
        print(" ".join([*(f"{k}={_quote(v)}" for k, v in env.items()), *(_quote(c) for c in cmd)]))
        return
    if shutil.which(cmd[0]) is None:
        _fail(f"{cmd[0]} not found: install fedcare (it brings flwr) on this machine")
    sys.stdout.flush()
    os.execvpe(cmd[0], cmd, {**os.environ, **env})


def _check_state_dir(state_dir: Path) -> None:
    """The site's state folder exists (made if need be), is a folder this process can write, and
    no other user can: it holds the site's private layers."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        _fail(f"--state-dir {state_dir}: exists and is not a directory")
    except OSError as e:
        _fail(f"--state-dir {state_dir}: cannot be made ({e.strerror or e})")
    if not os.access(state_dir, os.W_OK | os.X_OK):
        _fail(f"--state-dir {state_dir}: not writable by this user")
    mode = state_dir.stat().st_mode
    if mode & 0o002:
        _fail(f"--state-dir {state_dir}: writable by every user (mode {mode & 0o777:o}); another user could "
              f"replace this site's state: chmod o-w {state_dir}")


def _check_site_names(names: list[str]) -> None:
    from fedcare.config import site_name_problem

    for name in names:
        problem = site_name_problem(name)
        if problem:
            _fail(problem)


def _quote(s: str) -> str:
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\"'\"'") + "'"


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        _fail(f"--address {address!r}: expected HOST:PORT with a port from 1 to 65535, e.g. 0.0.0.0:9092")
    return host, int(port)


@flower_app.command()
def certs(
    out: Annotated[Path, typer.Argument(help="Folder to write ca.crt, server.pem/.key and keys/<site>{,.pub} into.")],
    host: Annotated[list[str], typer.Option(help="Name or IP address the SuperLink is reached at (repeatable).")] = ["127.0.0.1", "localhost"],
    site: Annotated[list[str], typer.Option(help="A site to make an authentication key pair for (repeatable).")] = [],
    days: Annotated[int, typer.Option(help="Validity of the certificates in days (at most 3650).")] = 365,
) -> None:
    """Coordinator: a CA, the SuperLink's TLS certificate and one key pair per site."""
    from fedcare.runtime.flower.certs import MAX_DAYS, make_certificates, make_site_key

    # before anything is written: a refused call leaves nothing behind
    _check_site_names(site)
    twice = sorted({n for n in site if [m.lower() for m in site].count(n.lower()) > 1})
    if twice:  # one key pair each; names that differ only in case are one file where case is not kept
        _fail(f"--site {twice[0]!r}: given twice (site names must differ, also in more than upper/lower case)")
    if not 1 <= days <= MAX_DAYS:
        _fail(f"--days {days}: from 1 to {MAX_DAYS} (ten years)")
    if (out / "ca.crt").exists():
        _fail(f"{out}: certificates exist already; choose another folder (a new CA would lock out every site)")
    existed = out.exists()
    before = set(out.rglob("*")) if out.is_dir() else set()
    try:
        make_certificates(out, list(host), days)
        for name in site:
            make_site_key(out, name)
    except (OSError, ValueError) as e:  # a full or read-only disk, a bad host name: nothing half-made is kept
        for path in sorted(set(out.rglob("*")) - before, reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        if not existed and out.is_dir():
            out.rmdir()
        _fail(f"{out}: {e}")
    console.print(f"wrote {out}/ca.crt, server.pem, server.key" + (f" and keys for {', '.join(site)}" if site else ""))


@flower_app.command("site-key")
def site_key(
    out: Annotated[Path, typer.Argument(help="Folder to write keys/<site> and keys/<site>.pub into.")],
    site: Annotated[str, typer.Argument(help="The site's name.")],
) -> None:
    """Site: make this site's authentication key pair (send only the .pub to the coordinator)."""
    from fedcare.runtime.flower.certs import make_site_key

    _check_site_names([site])
    try:
        private, public = make_site_key(out, site)
    except OSError as e:  # a key of that name (never overwritten), a read-only disk
        _fail(str(e) if e.filename is None else f"{e.filename}: {e.strerror}")
    console.print(f"wrote {private} (keep it at the site) and {public} (for the coordinator)")


@flower_app.command()
def superlink(
    certs_dir: Annotated[Optional[Path], typer.Option("--certs", help="Folder with ca.crt, server.pem, server.key.")] = None,
    address: Annotated[str, typer.Option(help="HOST:PORT the SuperLink listens on (SuperNodes and flwr connect here).")] = "0.0.0.0:9092",
    database: Annotated[Path, typer.Option(help="Run/state database (a file survives restarts).")] = Path("superlink.db"),
    insecure: Annotated[bool, typer.Option(help="No TLS and no node authentication: a local trial only.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Print Flower's command instead of running it.")] = False,
) -> None:
    """Coordinator: start Flower's SuperLink with TLS and SuperNode authentication."""
    host, port = _host_port(address)
    cmd = ["flower-superlink", "--host", host, "--port", str(port), "--database", str(database),
           "--isolation", "subprocess", "--disable-runtime-dependency-installation"]
    if insecure:
        cmd.append("--insecure")
    else:
        if certs_dir is None:
            _fail("give --certs DIR (from `fedcare flower certs`), or --insecure for a local trial")
        missing = [n for n in ("ca.crt", "server.pem", "server.key") if not (certs_dir / n).is_file()]
        if missing:
            _fail(f"{certs_dir}: missing {', '.join(missing)} (make them with `fedcare flower certs`)")
        cmd += ["--ssl-ca-certfile", str(certs_dir / "ca.crt"), "--ssl-certfile", str(certs_dir / "server.pem"),
                "--ssl-keyfile", str(certs_dir / "server.key"), "--enable-supernode-auth"]
    _exec(cmd, dry_run, SUPEREXEC_POLL)


@flower_app.command()
def supernode(
    site: Annotated[str, typer.Option(help="This site's name, as in the experiment's \\[deployment.sites] table.")],
    data_dir: Annotated[Path, typer.Option(help="This site's own data (e.g. its UNBC-McMaster copy).")],
    state_dir: Annotated[Path, typer.Option(help="Where this site keeps its private state between rounds.")],
    superlink_address: Annotated[str, typer.Option("--superlink", help="HOST:PORT of the SuperLink.")] = "127.0.0.1:9092",
    root_certificates: Annotated[Optional[Path], typer.Option(help="The federation's ca.crt.")] = None,
    auth_key: Annotated[Optional[Path], typer.Option(help="This site's private authentication key (keys/<site>).")] = None,
    port: Annotated[int, typer.Option(help="Local port of the SuperNode's ClientApp API (one per SuperNode on a machine).")] = 9094,
    insecure: Annotated[bool, typer.Option(help="No TLS and no authentication: a local trial only.")] = False,
    warm: Annotated[bool, typer.Option(help="Answer each message in a process forked from one warm fedcare process "
                                            "(`fedcare flower clientapps`: imports paid once); --no-warm: Flower's own "
                                            "new flwr-clientapp process per message.")] = True,
    preload: Annotated[list[str], typer.Option(help="With --warm: a module the warm process imports at start "
                                                    "(repeatable; default the ClientApp of `fedcare flower run`).")] = [],
    device: Annotated[Optional[str], typer.Option(help="The device this site trains on: auto, cpu, cuda, cuda:N or mps "
                                                       "(default: the experiment's \\[runtime] device).")] = None,
    preflight_min_count: Annotated[int, typer.Option(help="In this site's data summary (preflight), counts below "
                                                          "this are sent as '<N'.")] = 5,
    approved_apps: Annotated[Optional[Path], typer.Option(help="Run only the apps this site's operator approved: a "
                                                               "file of app digests (`fedcare flower app-digest`); "
                                                               "any other app is refused (needs --warm).")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print Flower's command instead of running it.")] = False,
) -> None:
    """Site: start a Flower SuperNode for this site."""
    _check_site_names([site])
    if approved_apps is not None:
        if not warm:
            _fail("--approved-apps: the warm launcher checks each app before Flower loads it; it cannot with --no-warm")
        _check_approved(approved_apps)
    if not 1 <= port <= 65535:
        _fail(f"--port {port}: not a port (1 to 65535)")
    if not data_dir.is_dir():
        _fail(f"--data-dir {data_dir}: no such directory")
    _check_state_dir(state_dir)
    if auth_key is not None and auth_key.is_file() and auth_key.stat().st_mode & 0o077:
        _fail(f"--auth-key {auth_key}: readable by others (mode {auth_key.stat().st_mode & 0o777:o}); "
              f"it is this site's identity: chmod 600 {auth_key}")
    if preflight_min_count < 1:
        _fail(f"--preflight-min-count {preflight_min_count}: at least 1 (1: no suppression)")
    if not dry_run:
        from fedcare.runtime.flower.processes import port_is_free

        if not port_is_free(port):  # Flower would log the clash and hang instead of exiting
            _fail(f"--port {port}: already in use on this machine (another SuperNode?); give each SuperNode its own --port")
    settings = [("site", site), ("data-dir", data_dir.resolve()), ("state-dir", state_dir.resolve()),
                ("preflight-min-count", preflight_min_count)]
    if device is not None:
        from fedcare.config import DEVICE_PATTERN
        from fedcare.device import DeviceUnavailable, resolve_device

        if not re.fullmatch(DEVICE_PATTERN, device):
            _fail(f"--device {device!r}: expected auto, cpu, cuda, cuda:N or mps")
        try:
            resolve_device(device)  # this machine has it: fail now, not at the first round
        except DeviceUnavailable as e:
            _fail(f"--device: {e}")
        settings.append(("device", device))
    if insecure:
        security = ["--insecure"]
    else:
        for option, path in (("--root-certificates", root_certificates), ("--auth-key", auth_key)):
            if path is None or not path.is_file():
                _fail(f"{option}: {'not given' if path is None else f'{path}: no such file'} (or --insecure for a local trial)")
        security = ["--root-certificates", str(root_certificates), "--auth-supernode-private-key", str(auth_key)]
        # the same key signs the coordinator's greeting: it proves this node is the site it says
        settings.append(("auth-key", auth_key.resolve()))
    node_config = " ".join(f'{k}={json.dumps(str(v))}' for k, v in settings)
    cmd = ["flower-supernode", "--superlink", superlink_address, "--host", "127.0.0.1", "--port", str(port),
           "--node-config", node_config, *security]
    if not warm:
        _exec(cmd, dry_run, SUPEREXEC_POLL)
        return
    # Flower starts no SuperExec with --isolation process: the warm launcher takes the tasks.
    # It is started first, then this process becomes the SuperNode (same pid). The launcher
    # ends with the SuperNode: it holds the read end of a pipe whose write end only the
    # SuperNode holds (kept open across exec), which closes however the SuperNode ends.
    cmd += ["--isolation", "process"]
    launcher = [sys.executable, "-m", "fedcare.cli", "flower", "clientapps", "--runtime-api", f"127.0.0.1:{port}",
                "--parent-pid", str(os.getpid())]
    for module in preload:
        launcher += ["--preload", module]
    if approved_apps is not None:
        launcher += ["--approved-apps", str(approved_apps.resolve())]
    if dry_run:
        print(" ".join(_quote(c) for c in launcher) + " &")
    else:
        if shutil.which(cmd[0]) is None:
            _fail(f"{cmd[0]} not found: install fedcare (it brings flwr) on this machine")
        end_of_supernode, supernode_alive = os.pipe()
        subprocess.Popen([*launcher, "--parent-pipe", str(end_of_supernode)], pass_fds=(end_of_supernode,))
        os.close(end_of_supernode)
        os.set_inheritable(supernode_alive, True)  # the SuperNode holds it until it ends
    _exec(cmd, dry_run)


@flower_app.command()
def clientapps(
    runtime_api: Annotated[str, typer.Option(help="HOST:PORT of the SuperNode's local Runtime API (its --port).")] = "127.0.0.1:9094",
    preload: Annotated[list[str], typer.Option(help="A module to import once at start (repeatable; default the "
                                                    "ClientApp of `fedcare flower run`).")] = [],
    parent_pid: Annotated[Optional[int], typer.Option(help="Exit when this process (the SuperNode) ends.")] = None,
    parent_pipe: Annotated[Optional[int], typer.Option(help="Exit when this file descriptor, the read end of a pipe only "
                                                            "the SuperNode holds open, closes (what `supernode` passes: "
                                                            "unlike --parent-pid, it notices a SuperNode that ended "
                                                            "but was not reaped yet).")] = None,
    poll_interval: Annotated[float, typer.Option(help="Seconds between two looks for a new message (Flower's SuperExec: 1 s).")] = 0.1,
    approved_apps: Annotated[Optional[Path], typer.Option(help="Run only the apps whose digests this file lists "
                                                               "(`fedcare flower app-digest`); refuse any other.")] = None,
) -> None:
    """Site: answer a SuperNode's messages from one warm process (started by `fedcare flower
    supernode`; run it yourself only next to a `flower-supernode --isolation process`)."""
    from fedcare.runtime.flower.warm import DEFAULT_PRELOAD, serve

    if not 0.01 <= poll_interval <= 60:
        _fail("--poll-interval: between 0.01 and 60 seconds")
    if parent_pipe is not None:
        try:
            os.fstat(parent_pipe)
        except OSError:
            _fail(f"--parent-pipe {parent_pipe}: not an open file descriptor of this process")
    if approved_apps is not None:
        _check_approved(approved_apps)
    serve(runtime_api, list(preload) or list(DEFAULT_PRELOAD), parent_pid, poll_interval, parent_pipe=parent_pipe,
          approved_apps=approved_apps)


def _check_approved(path: Path) -> None:
    """A site's allow-list of app digests is readable and lists at least one."""
    from fedcare.runtime.flower.approval import ApprovalError, read_approved

    try:
        read_approved(path)
    except ApprovalError as e:
        _fail(f"--approved-apps {e}")


@flower_app.command("app-digest")
def app_digest_command(
    approve: Annotated[Optional[Path], typer.Option(help="Site: also add the digest to this allow-list file (made if "
                                                         "missing), for `fedcare flower supernode --approved-apps`.")] = None,
) -> None:
    """Print the digest of the app `fedcare flower run` sends the sites (SHA-256 of its Flower App Bundle, built from
    this machine's fedcare): the coordinator publishes it; a site computes it from its own install and approves it."""
    from fedcare import __version__
    from fedcare.runtime.flower.approval import ApprovalError, app_digest, approve_line, read_approved

    with tempfile.TemporaryDirectory(prefix="fedcare-app-") as tmp:  # as `flwr run` sees it: a copy of the folder
        app = Path(tmp) / "app"
        shutil.copytree(app_dir(), app)
        digest = app_digest(app)
    print(digest)
    if approve is None:
        return
    if approve.exists():
        try:
            if digest in read_approved(approve):
                console.print(f"{approve}: approves it already")
                return
        except ApprovalError as e:
            if "approves no app" not in str(e):  # an empty file is fine to add to; a malformed one is not
                _fail(f"--approve {e}")
    try:
        with approve.open("a", encoding="utf-8") as f:
            f.write(approve_line(digest, f"fedcare {__version__} app"))
    except OSError as e:
        _fail(f"--approve {approve}: {e.strerror or e}")
    console.print(f"{approve}: approved it (give the SuperNode --approved-apps {approve})")


@flower_app.command("site-record")
def site_record(
    state_dir: Annotated[Path, typer.Argument(help="The site's --state-dir (its record is run-<key>/client-<id>.record.jsonl).")],
    lineage: Annotated[Optional[Path], typer.Option(help="The coordinator's run directory (at least its lineage.jsonl and "
                                                         "run.json): compare the site's record with its lineage.")] = None,
    run: Annotated[Optional[str], typer.Option(help="The run's key (run.json's flower_run); default: the --lineage "
                                                    "run's, else every run in STATE_DIR.")] = None,
) -> None:
    """Site: print the site's own record of the models it received and the updates it sent (checking its hash
    chain); with --lineage, say which of the coordinator's models its data touched and whether anything disagrees."""
    from rich.table import Table

    from fedcare.errors import UserError
    from fedcare.runtime.flower.site_record import RECORD_SUFFIX, client_of, compare
    from fedcare.runtime.hashchain import check_chain
    from fedcare.runtime.lineage_verify import verify_lineage
    from fedcare.studies.rundir import read_run_info

    if lineage is not None and run is None:
        run = str(read_run_info(lineage)[0].get("flower_run") or "")
        if not run:
            _fail(f"--lineage {lineage}: run.json names no flower_run (not a run across sites?)")
    if run is not None and not re.fullmatch(r"[0-9a-f]{8,64}", run):
        _fail(f"--run {run!r}: not a run key (hex digits)")
    files = sorted(state_dir.glob(f"run-{run or '*'}/*{RECORD_SUFFIX}"))
    if not files:
        _fail(f"{state_dir}: no site record{f' of run {run}' if run else ''} (a site keeps one in its --state-dir)")
    out = Console(soft_wrap=True)
    try:
        lineage_records = verify_lineage(lineage, models=(lineage / "models").is_dir()).records if lineage else None
        for path in files:
            entries = check_chain(path)
            table = Table("#", "kind", "algorithm", "phase", "round", "received", "sent", "examples", box=None,
                          pad_edge=False, title=f"{path} (its hash chain holds)")
            for e in entries:
                table.add_row(str(e["seq"]), e["type"], escape(str(e["algorithm"])), escape(str(e["phase"])),
                              str(e["round"]), e["received"][:12], e.get("sent", "")[:12], str(e.get("examples", "")))
            out.print(table)
            if lineage_records is not None:
                _print_comparison(out, compare(entries, lineage_records, client_of(path)))
    except UserError as e:
        _fail(str(e))


def _print_comparison(out: Console, c) -> None:
    """What a site's record and the coordinator's lineage say together; exit 2 when they disagree."""
    out.print(f"client {escape(c.client)}: {c.fits} updates sent; {len(c.used)} in the lineage's aggregates as sent, "
              f"{len(c.hidden)} in a secure sum (not visible to the coordinator), {len(c.left_out)} left out",
              highlight=False)
    for entry, why in c.left_out:
        out.print(f"  left out: {escape(entry['phase'])} round {entry['round']}: {escape(why)}", highlight=False)
    out.print(f"its data are in {len(c.aggregates)} aggregates; the saved models they lead to: "
              + (escape(", ".join(m["file"] for m in c.models)) or "none"), highlight=False)
    if c.site_code and c.coordinator_code:
        same = c.site_code == c.coordinator_code
        out.print("the fedcare code the site ran: " + ("the coordinator's (same digest)" if same else
                  f"{', '.join(sorted(c.site_code))[:64]}, the coordinator's {', '.join(sorted(c.coordinator_code))[:64]}"),
                  highlight=False)
    if not c.agrees:
        for problem in c.problems:
            out.print(f"  [bold red]disagrees:[/] {escape(problem)}", highlight=False)
        _fail(f"the site's record and the coordinator's lineage disagree ({len(c.problems)} problems)")
    out.print("the site's record and the coordinator's lineage agree", highlight=False)


def _resumable(resume: Path) -> tuple[Path, Path, Path]:
    """(partial directory, final run directory, its config.toml) of a run across sites to
    continue; fails naming the problem (a finished run, a run of `fedcare run`, no checkpoint)."""
    from fedcare.studies.rundir import describe_partial, final_of, partial_of, read_run_info

    partial = partial_of(resume).resolve()
    if not partial.is_dir():
        done = final_of(partial)
        _fail(f"--resume {resume}: " + ("this run finished; there is nothing to resume" if done.is_dir()
                                        else "no such run directory (it lives on the coordinator's machine)"))
    info = read_run_info(partial)[0]
    if info.get("runtime") != "flower":
        _fail(f"--resume {partial}: not a run across sites; continue it with: fedcare resume {partial}")
    if info.get("status") == "running":
        problem = describe_partial(partial)
        if "another run is writing here" in problem:
            _fail(f"--resume {partial}: {problem.split(': ', 1)[1]}")
    if not (partial / "config.toml").is_file():
        _fail(f"--resume {partial}: no config.toml in it")
    return partial, final_of(partial), partial / "config.toml"


def with_gpus(federation_config: str, gpus_per_site: float) -> str:
    """A Simulation Engine's federation config with the experiment's GPU share per simulated
    site (Ray's client_resources), unless the config already gives one."""
    if gpus_per_site <= 0 or "client-resources-num-gpus" in federation_config:
        return federation_config
    return f"{federation_config} client-resources-num-gpus={gpus_per_site:g}"


def app_dir() -> Path:
    """The Flower App `flwr run` sends: a pyproject.toml naming fedcare's ServerApp and ClientApp."""
    return Path(str(files("fedcare") / "deployment" / "flwr_app"))


def run_status(federation: str, run_id: int, tries: int = 3) -> dict | None:
    """The run's status from `flwr ls`; None when the SuperLink does not answer `tries` times in a row."""
    for attempt in range(tries):
        out = subprocess.run(["flwr", "ls", federation, "--run-id", str(run_id), "--format", "json"],
                             capture_output=True, text=True)
        try:
            return json.loads(out.stdout)["runs"][0]
        except (json.JSONDecodeError, KeyError, IndexError):
            if attempt + 1 < tries:
                time.sleep(attempt + 1)
    return None


def resume_command(partial: Path, federation: str, site_keys: Optional[Path], unverified_sites: bool,
                   simulation: list[str]) -> str:
    """The command that continues an interrupted run across the sites, with the options it ran with."""
    options = [f"--federation {_quote(federation)}"]
    if site_keys is not None:
        options.append(f"--site-keys {_quote(str(site_keys.resolve()))}")
    if unverified_sites:
        options.append("--unverified-sites")
    return " ".join([f"fedcare flower run --resume {_quote(str(partial))}", *options, *simulation])


SUPERLINK_BACK = "once the SuperLink is back (restarted with the same --database)"


def _interrupted(what: str, partial: Path, resume: str, when: str = SUPERLINK_BACK) -> None:
    """Fail saying what happened to the run and how to continue it from its finished units."""
    checkpoint = partial / "checkpoint.pt"
    if checkpoint.is_file():
        _fail(f"{what}. Its finished units are kept in {partial}; {when}, continue with: {resume}")
    if partial.is_dir():
        _fail(f"{what}, before any unit had finished ({partial} holds no checkpoint): start the run again")
    _fail(f"{what}. If {checkpoint} exists on the coordinator's machine, its finished units are kept: {when}, "
          f"continue with: {resume}")


PREFLIGHT = ".preflight"  # `--preflight-only --out runs/x` checks into runs/x.preflight


def new_out(config: Path, out: Path | None, preflight_only: bool) -> Path:
    """The folder a new run across sites writes into, on the coordinator: `--out` (default
    runs/<config>-flower-<time>), absolute. A `--preflight-only` check writes into `<out>.preflight`,
    so that the run it checks for can take `--out` itself afterwards."""
    if out is None:
        out = Path("runs") / f"{config.stem}-flower-{datetime.now():%Y%m%d-%H%M%S}"
    out = out.resolve()
    return out.with_name(out.name + PREFLIGHT) if preflight_only else out


def _print_preflight(out: Path) -> None:
    """The sites' data summaries of a --preflight-only run, when its directory is on this machine."""
    from fedcare.deployment.app import PREFLIGHT_FILE
    from fedcare.runtime.preflight import describe

    path = out / PREFLIGHT_FILE
    if not path.is_file():
        print(f"Preflight passed; its summary is on the coordinator's machine: {path}")
        return
    preflight = json.loads(path.read_text())
    for name, site in preflight["sites"].items():
        print(f"{name} ({site['client']}): {describe(site['summary']) if site['summary'] else 'no summary'}")
    for warning in preflight["warnings"]:
        print(f"warning: {warning}")
    print(f"Preflight passed: {path}")


@flower_app.command("run")
def run_command(
    config: Annotated[Optional[Path], typer.Argument(help="Experiment TOML file (as for `fedcare run`).")] = None,
    federation: Annotated[str, typer.Option(help="The SuperLink connection in $FLWR_HOME/config.toml.")] = "",
    resume: Annotated[Optional[Path], typer.Option(help="Continue this interrupted run across the sites (its .partial "
                                                        "directory, on the coordinator's machine) instead of a new one.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override a config key (repeatable; not with --resume, which "
                                                          "continues the recorded config).")] = [],
    out: Annotated[Optional[Path], typer.Option(help="Run directory, on the coordinator's machine (default runs/<config>-flower-<time>).")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="Simulation only: the data every simulated site reads.")] = None,
    state_dir: Annotated[Optional[Path], typer.Option(help="Simulation only: where simulated sites keep their state.")] = None,
    federation_config: Annotated[Optional[str], typer.Option(help="Simulation only: passed to flwr run, e.g. 'num-supernodes=3'.")] = None,
    site_keys: Annotated[Optional[Path], typer.Option(help="The sites' public keys (the keys/ folder of `fedcare flower certs`, "
                                                           "<site>.pub files): each site must prove it holds its key.")] = None,
    unverified_sites: Annotated[bool, typer.Option(help="Take each SuperNode at its word about which site it is "
                                                        "(a local trial only; any registered node could claim any site).")] = False,
    preflight_only: Annotated[bool, typer.Option(help="Only check each site's data summary against the experiment "
                                                      "(written to OUT.preflight/preflight.json, so the run can take --out OUT), then stop; "
                                                      "no training.")] = False,
) -> None:
    """Researcher: run an experiment across the sites, wait for it, fail unless it completed
    (or, with --resume, continue an interrupted one from its last finished unit)."""
    from fedcare.config import ConfigError, to_toml
    from fedcare.data.console import user_error
    from fedcare.deployment.app import check_experiment
    from fedcare.runtime.flower.identity import SiteKeyError, read_site_keys
    from fedcare.studies.load import load_config
    from fedcare.studies.rundir import partial_of

    if not federation:
        _fail("--federation: not given (the SuperLink connection in $FLWR_HOME/config.toml)")
    if (config is None) == (resume is None):
        _fail("give the experiment's CONFIG file, or --resume RUN_DIR.partial to continue an interrupted run")
    if resume is not None:
        if preflight_only:  # its check went into the run's own name, which the resume then found taken
            _fail("--preflight-only: for a new run; a resume checks the sites' data itself before it continues")
        if set_:  # it was dropped without a word: the sites would run another experiment than the one asked for
            _fail(f"--set {set_[0]}: a resume continues the experiment the run recorded (its config.toml), unchanged; "
                  "start a new run to change it")
        partial, out, config = _resumable(resume)
    try:
        experiment = load_config(config, set_)
        check_experiment(experiment, str(config))
    except ConfigError as e:
        user_error(e)
    simulated = data_dir is not None or federation_config is not None
    if site_keys is not None and (simulated or unverified_sites):
        _fail("--site-keys: for sites on a SuperLink (not with --data-dir, --federation-config or --unverified-sites)")
    if site_keys is None and not simulated and not unverified_sites:
        _fail("--site-keys: not given: the folder of the sites' <site>.pub keys, so that no node can claim a site "
              "it holds no key for (or --unverified-sites for a local trial)")
    try:
        keys = read_site_keys(site_keys) if site_keys is not None else None
    except SiteKeyError as e:
        _fail(f"--site-keys {e}")
    if resume is None:
        out = new_out(config, out, preflight_only)
        if out.exists():
            _fail(f"{out}: {'the check' if preflight_only else 'run directory'} already exists; choose another --out "
                  "or remove it")
    run_config = {"experiment": to_toml(experiment), "experiment-name": config.name, "out": str(out),
                  "data-dir": str(data_dir.resolve()) if data_dir else "", "state-dir": str(state_dir.resolve()) if state_dir else "",
                  "resume": str(partial) if resume is not None else "",
                  "site-keys": json.dumps(keys) if keys is not None else "", "preflight-only": preflight_only}
    with tempfile.TemporaryDirectory(prefix="fedcare-flwr-") as tmp:
        app = Path(tmp) / "app"
        shutil.copytree(app_dir(), app)  # flwr may write into the app folder: never into the installed package
        rc_file = Path(tmp) / "run-config.toml"
        # JSON strings are valid TOML basic strings (same escapes)
        rc_file.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in run_config.items()))
        cmd = ["flwr", "run", str(app), federation, "--run-config", str(rc_file), "--stream"]
        if federation_config:
            cmd += ["--federation-config", with_gpus(federation_config, experiment.runtime.gpus_per_site)]
        console.print(f"{'continuing' if resume else 'checking' if preflight_only else 'starting'} {config.name} on "
                      f"{federation!r}; {'preflight into' if preflight_only else 'run directory'} {out}")
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sys.stdout.write(proc.stdout)
    match = re.search(r"Successfully started run (\d+)", proc.stdout)
    if match is None:
        _fail(f"flwr run did not start the run (exit code {proc.returncode}); see its output above")
    run_id = int(match.group(1))
    simulation = [f"{o} {_quote(str(v))}" for o, v in (("--data-dir", data_dir), ("--state-dir", state_dir),
                                                        ("--federation-config", federation_config)) if v is not None]
    resume_with = resume_command(partial_of(out), federation, site_keys, unverified_sites, simulation)
    status = run_status(federation, run_id)
    while status is not None and not str(status.get("status", "")).startswith("finished"):  # --stream may return
        time.sleep(1)  # before the status is final, or end when its log stream breaks
        status = run_status(federation, run_id)
    if status is None:  # flwr run said "Connection to the SuperLink is unavailable"
        _interrupted(f"run {run_id} started, then the SuperLink stopped answering (flwr run exited with "
                     f"{proc.returncode}): the coordinator crashed or was stopped", partial_of(out), resume_with)
    if status["status"] != FINISHED_OK:
        details = f"run {run_id} ended {status['status']}: {status.get('status-details', '')}".strip()
        if (partial_of(out) / "checkpoint.pt").is_file():
            _interrupted(details, partial_of(out), resume_with, "once what stopped it is put right")
        _fail(details)
    console.print(f"run {run_id} completed in {time.perf_counter() - t0:.0f} s")
    if preflight_only:
        _print_preflight(out)
        return
    if (out / "report.html").is_file():
        from fedcare.studies.run import summary_markdown

        print(summary_markdown(out))
        print(f"\nReport: {out / 'report.html'}")
    else:
        print(f"Run directory (on the coordinator's machine): {out}")
