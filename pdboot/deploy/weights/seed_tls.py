"""The seed server's throwaway TLS identity (`weights.seed: first_host`): a self-signed
certificate and key pdboot makes for the run, never written on the operator's machine. The
key goes only to the seeding host's server container, the certificate to every fetcher,
which trusts exactly that certificate (its only CA) and checks the first host's advertised
address in its subjectAltName; the seed token and the tar then cross only inside TLS 1.2+.

ECDSA P-256: made in milliseconds. The extensions are those a strict verifier (Python 3.13's
VERIFY_X509_STRICT) wants of a self-signed end-entity certificate.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = timedelta(days=2)  # a run's seeding; bounded by the pull step's deadline
CLOCK_SKEW = timedelta(minutes=10)  # the hosts' clocks may lag the operator's


@dataclass(frozen=True)
class SeedCert:
    cert: str  # PEM: handed to the fetchers
    key: str = field(repr=False)  # PEM: a secret, only for the seeding host


def subject_alt_name(address: str) -> x509.GeneralName:
    """An IP address entry for an IP (how TLS clients match an IP URL), else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(address))
    except ValueError:
        return x509.DNSName(address)


def make_seed_cert(address: str, now: datetime, valid_for: timedelta = VALID_FOR) -> SeedCert:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pdboot weights seed")])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + valid_for)
        .add_extension(x509.SubjectAlternativeName([subject_alt_name(address)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")
    return SeedCert(cert.public_bytes(serialization.Encoding.PEM).decode("ascii"), key_pem)
