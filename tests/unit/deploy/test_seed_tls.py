"""The seed server's throwaway certificate (deploy/weights/seed_tls.py): the first host's
address in its subjectAltName as a client matches it, valid for the run only, an end-entity
certificate, its key never shown."""

from __future__ import annotations

import ipaddress
from datetime import datetime, timezone

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pdboot.deploy.weights.seed_tls import CLOCK_SKEW, VALID_FOR, make_seed_cert

NOW = datetime(2026, 12, 6, 8, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("address", "kind", "want"),
    [
        ("10.0.0.5", x509.IPAddress, ipaddress.ip_address("10.0.0.5")),
        ("fd00::5", x509.IPAddress, ipaddress.ip_address("fd00::5")),
        ("gpu-a.internal", x509.DNSName, "gpu-a.internal"),
    ],
)
def test_the_address_is_the_only_subject_alt_name(address: str, kind: type, want: object) -> None:
    cert = x509.load_pem_x509_certificate(make_seed_cert(address, NOW).cert.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(san) == [kind(want)]


def test_valid_for_the_run_only_and_not_a_ca() -> None:
    cert = x509.load_pem_x509_certificate(make_seed_cert("10.0.0.5", NOW).cert.encode())
    assert cert.not_valid_before_utc == NOW - CLOCK_SKEW
    assert cert.not_valid_after_utc == NOW + VALID_FOR
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.issuer == cert.subject  # self-signed: the fetchers pin this very certificate


def test_the_key_matches_and_is_new_each_run_and_never_in_repr() -> None:
    a, b = make_seed_cert("10.0.0.5", NOW), make_seed_cert("10.0.0.5", NOW)
    assert a.key != b.key and a.cert != b.cert
    key = serialization.load_pem_private_key(a.key.encode(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    cert = x509.load_pem_x509_certificate(a.cert.encode())
    assert cert.public_key() == key.public_key()
    assert "PRIVATE" not in repr(a) and a.key not in repr(a)
