"""Certificates and keys for a Flower deployment, made with the `cryptography` package.

- a certificate authority (`ca.crt`, `ca.key`): every SuperNode and the researcher's `flwr`
  trust the SuperLink through `ca.crt`; keep `ca.key` offline;
- the SuperLink's TLS certificate (`server.pem`, `server.key`), valid for the given host
  names and IP addresses;
- one authentication key pair per site (`keys/<site>`, `keys/<site>.pub`): EC P-384 in
  OpenSSH format, as Flower's SuperNode authentication expects. The private key stays at its
  site; the public key is registered with the SuperLink (`flwr supernode register`).

For production, a hospital's own PKI may issue the TLS certificate instead; the SuperLink
only needs the three PEM files.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from fedcare.files import atomic_write_bytes

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


MAX_DAYS = 3650  # ten years: longer than any certificate should live (10^7 days overflowed the date)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Write a certificate (follows the umask) or a key (0600 from creation: no window); never
    over an existing file: a key overwritten locks its site out, or lets another site in."""
    atomic_write_bytes(path, data, private=private, exclusive=True)


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_certificates(out: Path, hosts: list[str], days: int = 365) -> None:
    """CA and SuperLink certificate for `hosts` (names or IP addresses) into `out`."""
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"--days {days}: from 1 to {MAX_DAYS} (ten years)")
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedcare federation CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    _write(out / "ca.key", _pem_key(ca_key), private=True)
    _write(out / "ca.crt", ca.public_bytes(serialization.Encoding.PEM))

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write(out / "server.key", _pem_key(key), private=True)
    _write(out / "server.pem", cert.public_bytes(serialization.Encoding.PEM))


def make_site_key(out: Path, site: str) -> tuple[Path, Path]:
    """A site's SuperNode authentication key pair: `keys/<site>` (private) and `.pub`; never
    over an existing key (FileExistsError naming it)."""
    keys = out / "keys"
    private, public = keys / site, keys / f"{site}.pub"
    for path in (private, public):
        if path.exists():
            raise FileExistsError(f"{path}: exists already; a key is never overwritten")
    keys.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    _write(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                      serialization.NoEncryption()), private=True)
    _write(public, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                 serialization.PublicFormat.OpenSSH) + f" {site}\n".encode())
    return private, public
