"""router.tls end to end (issue 28): a test CA signs the endpoint's certificate (the router
host's address as its IP SAN); `up` ships the pair 0600 to the router host, the real nginx
serves HTTPS on router.port, pdboot's own checks go through it (trusting the test CA via
SSL_CERT_FILE, as an operator's private CA would be), and a client that trusts the CA gets
its completions; plain HTTP on that port gets nothing from the router."""

from __future__ import annotations

import ipaddress
import json
import ssl
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.cli import Cli

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_pki(address: str, out: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, cert.pem, key.pem): a CA and the endpoint's certificate for ``address``."""
    now = datetime.now(timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder().subject_name(_name("pdboot test CA"))
        .issuer_name(_name("pdboot test CA")).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(_name("endpoint")).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    paths = (out / "ca.pem", out / "cert.pem", out / "key.pem")
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    paths[2].chmod(0o600)
    return paths


def test_tls_endpoint_with_a_test_ca(cli: Cli, testbed_clean: Any, tmp_path: Path) -> None:
    tb = testbed_clean
    ingress = tb.hosts["ingress"].address
    ca, cert, key = make_pki(ingress, tmp_path)
    cli = cli.with_(env={"SSL_CERT_FILE": str(ca)})  # pdboot trusts the test CA
    inv = tb.inventory(
        tb.dir / "tls.yaml",
        name="e2etls",
        overrides={
            "router": {"tls": {"cert": f"file:{cert}", "key": f"file:{key}"}},
            "prefill": {"env": {"STANDIN_LOAD_SECONDS": "0.5"}},
            "decode": {"env": {"STANDIN_LOAD_SECONDS": "0.5"}},
        },
    )
    up = cli("up", str(inv), "--skip-preflight")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"https://{ingress}:8000/v1" in up.stdout  # the endpoint, as printed
        assert "decode pulled the KV cache from a prefill engine" in up.stdout + up.stderr
        modes = tb.hosts["ingress"].exec(
            "stat -c '%a' /var/lib/pdboot/e2etls/proxy-tls.key /var/lib/pdboot/e2etls/proxy-tls.crt"
        )
        assert modes.stdout.split() == ["600", "600"], modes
        trusting = ssl.create_default_context(cafile=str(ca))
        body = json.dumps({"model": "Qwen/Qwen3-0.6B", "prompt": "hi", "max_tokens": 2}).encode()
        req = urllib.request.Request(
            f"https://{ingress}:8000/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60, context=trusting) as r:
            assert r.status == 200 and json.loads(r.read())["choices"][0]["text"]
        with pytest.raises(urllib.error.URLError):  # the system store does not know the CA
            urllib.request.urlopen(
                f"https://{ingress}:8000/health", timeout=10, context=ssl.create_default_context()
            )
        with pytest.raises(urllib.error.HTTPError) as plain:  # nginx: HTTP on an HTTPS port
            urllib.request.urlopen(f"http://{ingress}:8000/v1/models", timeout=10)
        assert plain.value.code == 400
        st = cli("status", str(inv), "--json")
        doc = json.loads(st.stdout)
        assert doc["endpoint"] == f"https://{ingress}:8000/v1" and doc["healthy"], st.stdout
    finally:
        down = cli("down", str(inv))
    assert down.returncode == 0, down.stdout + down.stderr
