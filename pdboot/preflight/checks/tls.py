"""``tls.certificate`` (router host, with ``router.tls``): the key matches the certificate, and
the certificate is valid now and for a while yet. Pure: PEM text and a time in, verdicts out
(the files are read on the operator's machine, transport/tls_files.py)."""

from __future__ import annotations

import os
import stat
from datetime import datetime, timedelta

from pdboot.inventory.schema import Inventory
from pdboot.preflight.checks import CheckResult
from pdboot.transport.secret_refs import SecretError
from pdboot.transport.tls_files import read_tls

CHECK_ID = "tls.certificate"
SOON = timedelta(days=14)


def evaluate(inv: Inventory, now: datetime) -> list[CheckResult]:
    """router.tls read here, on the operator's machine (where `up` reads it): none without
    TLS, a failure naming the reference that cannot be read or a key file others can read."""
    try:
        pair = read_tls(inv)
    except SecretError as e:
        return [CheckResult(CHECK_ID, "fail", str(e), "fix the reference in router.tls")]
    if pair is None:
        return []
    assert inv.router.tls is not None
    exposed = key_file_exposed(inv.router.tls.key)
    return [exposed] if exposed is not None else [evaluate_pair(pair.cert, pair.key, now)]


def key_file_exposed(ref: str) -> CheckResult | None:
    """A failure when router.tls.key is a file that its group or others may read or write
    (the private key of the endpoint: its owner's alone, like secrets); None otherwise."""
    if ref.startswith("env:"):
        return None
    path = os.path.expanduser(ref[5:] if ref.startswith("file:") else ref)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)  # read_tls has just read it
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return CheckResult(
        CHECK_ID,
        "fail",
        f"router.tls.key {path} is readable or writable by its group or others (mode {mode:o})",
        f"chmod 600 {path}",
    )


def evaluate_pair(cert_pem: str, key_pem: str, now: datetime) -> CheckResult:
    # imported here: cryptography's x509 costs every preflight tens of ms, and only a
    # deployment with router.tls has a pair to read
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    fix = "point router.tls.cert and router.tls.key at a matching, current pair (PEM)"
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
    except ValueError as e:
        return CheckResult(CHECK_ID, "fail", f"router.tls.cert is not a PEM certificate: {e}", fix)
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError) as e:
        return CheckResult(CHECK_ID, "fail", f"router.tls.key is not an unencrypted key: {e}", fix)
    raw = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if cert.public_key().public_bytes(der, raw) != key.public_key().public_bytes(der, raw):
        return CheckResult(
            CHECK_ID, "fail", "router.tls.key does not belong to router.tls.cert", fix
        )
    subject = cert.subject.rfc4514_string()
    end, start = cert.not_valid_after_utc, cert.not_valid_before_utc
    if now >= end:
        return CheckResult(CHECK_ID, "fail", f"{subject} expired on {end:%Y-%m-%d}", fix)
    if now < start:
        return CheckResult(CHECK_ID, "fail", f"{subject} is valid only from {start:%Y-%m-%d}", fix)
    if end - now < SOON:
        return CheckResult(
            CHECK_ID, "warn", f"{subject} expires on {end:%Y-%m-%d} (within 14 days)", fix
        )
    return CheckResult(CHECK_ID, "pass", f"{subject}: key matches, valid until {end:%Y-%m-%d}")
