"""Sites that run only the app their operator approved: an allow-list of app digests.

What a coordinator sends a site with every run is a Flower App Bundle (FAB): a zip of the app
folder (fedcare's is `fedcare/deployment/flwr_app`: one pyproject.toml naming fedcare's
ServerApp and ClientApp, which every machine has installed). Flower puts the FAB's folder on
the ClientApp process's import path and loads the app it names, so a FAB can carry code the
site would execute: another ClientApp, or a module that shadows one the app imports later.

Flower's own answer, a SuperNode's `--trusted-entities`, accepts only FABs that carry
verifications issued by the Flower platform (Flower Hub: `fab.verifications`, with a
"valid_license"); a FAB that `flwr run` sends from a folder carries none and is refused, so an
offline deployment cannot use it. fedcare's answer is an allow-list kept by the site: its
operator approves the SHA-256 of the FAB (the same digest Flower names a FAB by), computed on
the site's own machine from the app its own fedcare would send (`app_digest`,
`fedcare flower app-digest`), and the site's warm launcher (`fedcare.runtime.flower.warm`)
checks every FAB before Flower installs or loads it (`approve_only`): a FAB whose digest is
not listed, one changed byte included, is refused with an error at the site and in its
reply, and the coordinator records the site as refused.
"""

from __future__ import annotations

import hashlib
import re
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

from fedcare.runtime.sites import SiteError

DIGEST = re.compile(r"[0-9a-f]{64}")


class ApprovalError(SiteError):
    """The allow-list cannot be read, or names something that is not an app digest."""


class AppNotApproved(SiteError):
    """The app a coordinator sent is not one this site's operator approved."""


def fab_digest(fab: bytes) -> str:
    """A FAB's digest: SHA-256 of its bytes, as Flower names it (`Fab.hash_str`)."""
    return hashlib.sha256(fab).hexdigest()


def build_fab(app: Path) -> bytes:
    """The FAB that `flwr run` builds from the app folder `app` (Flower's own builder,
    deterministic: sorted files, fixed dates)."""
    from flwr.cli.build import build_fab_from_disk

    with warnings.catch_warnings():  # Flower's file filter warns of its own dependency's deprecations
        warnings.simplefilter("ignore", DeprecationWarning)
        return build_fab_from_disk(Path(app))


def app_digest(app: Path) -> str:
    """The digest of the FAB that `flwr run` builds from the app folder `app`."""
    return fab_digest(build_fab(app))


def read_approved(path: Path) -> frozenset[str]:
    """The digests an allow-list approves: one per line (64 hex digits, then anything: a
    comment), `#` lines and blank lines ignored. `ApprovalError` naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ApprovalError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    approved = set()
    for number, line in enumerate(lines, start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if not DIGEST.fullmatch(words[0].lower()):
            raise ApprovalError(f"{path} line {number}: {words[0][:80]!r} is not an app digest (64 hex digits, "
                                "from `fedcare flower app-digest`)")
        approved.add(words[0].lower())
    if not approved:
        raise ApprovalError(f"{path}: approves no app (add the digest from `fedcare flower app-digest`)")
    return frozenset(approved)


def approve_line(digest: str, what: str) -> str:
    """An allow-list line for `digest`, with what it is and when it was approved."""
    return f"{digest}  {what}, approved {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n"


def check_app(fab: bytes, approved: frozenset[str], source: Path | str) -> None:
    """`AppNotApproved` unless the FAB's digest is in `approved` (read from `source`)."""
    digest = fab_digest(fab)
    if digest not in approved:
        raise AppNotApproved(f"this site runs only approved apps: the app it was sent (sha256 {digest}) is not in "
                             f"{source}; nothing of it was installed or run")


def approve_only(approved: frozenset[str], source: Path | str) -> None:
    """In this ClientApp process: check every FAB before Flower installs it (Flower's
    `run_clientapp` installs the FAB right after pulling it, before loading any of its code).
    A refused FAB raises inside `run_clientapp`, which answers the message with that error."""
    from flwr.supernode.runtime import run_clientapp

    install = run_clientapp.install_from_fab

    def install_if_approved(fab_file, *args, **kwargs):
        content = fab_file if isinstance(fab_file, bytes) else Path(fab_file).read_bytes()
        try:
            check_app(content, approved, source)
        except AppNotApproved as e:
            print(f"fedcare: refused an app: {e}", file=sys.stderr, flush=True)  # in the SuperNode's log
            raise
        return install(fab_file, *args, **kwargs)

    run_clientapp.install_from_fab = install_if_approved
