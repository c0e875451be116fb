"""Which site a Flower node is, proved with the site's authentication key.

Flower's SuperLink lets in any SuperNode whose public key is registered, and anyone who can
reach the SuperLink's Control API can register a key; it does not know which *site* a key
belongs to. fedcare's coordinator does: `fedcare flower certs` made `keys/<site>` and
`keys/<site>.pub`. So the greeting carries a fresh random challenge, each site signs
(challenge, site name, client id) with its private key (the SuperNode's `--auth-key`), and the
coordinator checks the signature against `<site>.pub`. A node that claims a site without
its key is refused and never takes that site's place. A site that cannot take part (its data,
its settings) signs (challenge, site name, its error) instead: its failure is then known to be
that site's, not a stranger's.
"""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from fedcare.config import site_name_problem
from fedcare.errors import UserError

_SIGNATURE = ec.ECDSA(hashes.SHA384())  # the keys are EC P-384 (certs.make_site_key)


class SiteKeyError(UserError, ValueError):
    """A site key file that cannot be used; the message names the file."""


def new_challenge() -> str:
    return secrets.token_hex(32)


def _claim(challenge: str, site: str, client: object, error: str | None) -> bytes:
    if error is not None:  # a failure: the site says why it cannot take part
        return "\0".join(["fedcare-site-failure-v1", challenge, site, error]).encode()
    return "\0".join(["fedcare-site-claim-v1", challenge, site, str(client)]).encode()


def sign_claim(key_file: Path, challenge: str, site: str, client: object, error: str | None = None) -> str:
    """The site's signature (base64) of its claim to be `site` (client `client`), or with
    `error`, of its failure to take part."""
    try:
        key = load_ssh_private_key(key_file.read_bytes(), password=None)
    except (OSError, ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise SiteKeyError(f"{key_file}: not this site's private key ({e})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise SiteKeyError(f"{key_file}: not an EC key (make it with `fedcare flower site-key`)")
    return base64.b64encode(key.sign(_claim(challenge, site, client, error), _SIGNATURE)).decode()


def claim_problem(public_key: str, signature: object, challenge: str, site: str, client: object,
                  error: str | None = None) -> str | None:
    """Why a site's claim (or, with `error`, its failure) does not hold (None: it holds)."""
    if not isinstance(signature, str) or not signature:
        return "it sent no signature (its SuperNode was started without --auth-key)"
    try:
        key = load_ssh_public_key(public_key.encode())
        key.verify(base64.b64decode(signature, validate=True), _claim(challenge, site, client, error), _SIGNATURE)
    except (InvalidSignature, ValueError, TypeError):
        return f"its signature does not match {site}.pub (it does not hold the site's key)"
    return None


def read_site_keys(folder: Path) -> dict[str, str]:
    """Every `<site>.pub` in `folder` (the `keys/` folder of `fedcare flower certs`), by site name."""
    if not folder.is_dir():
        raise SiteKeyError(f"{folder}: no such directory")
    keys = {}
    for path in sorted(folder.glob("*.pub")):
        site = path.name[: -len(".pub")]
        if site_name_problem(site):
            raise SiteKeyError(f"{path}: {site_name_problem(site)}")
        try:
            text = path.read_text(errors="replace").strip()
        except OSError as e:  # a folder named x.pub, a file this user cannot read
            raise SiteKeyError(f"{path}: cannot be read ({e.strerror or e})") from None
        try:
            if not isinstance(load_ssh_public_key(text.encode()), ec.EllipticCurvePublicKey):
                raise ValueError("not an EC key: make it with `fedcare flower site-key`")
        except (ValueError, TypeError, UnsupportedAlgorithm) as e:  # a key type cryptography does not know too
            raise SiteKeyError(f"{path}: not a site's public key ({e})") from None
        keys[site] = text
    if not keys:
        raise SiteKeyError(f"{folder}: no <site>.pub files (the keys/ folder of `fedcare flower certs`)")
    return keys
