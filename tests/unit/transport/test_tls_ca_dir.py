"""The registry lookups' TLS context reads the system's hashed CA directory instead of parsing
the whole CA bundle on every run (transport/http.py: ca_dir, issue 35), and still verifies:
a real TLS handshake on loopback passes with the CA in the directory and fails with a
certificate from a CA that is not there, or for another host name."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from pdboot.transport import http


def _openssl(*args: str | Path) -> str:
    return subprocess.run(
        ["openssl", *map(str, args)], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", crt, "-days", "2", "-subj", f"/CN={name}")  # fmt: skip
    return key, crt


def _leaf(d: Path, ca: tuple[Path, Path], host: str) -> tuple[Path, Path]:
    key, csr, crt, ext = d / "leaf.key", d / "leaf.csr", d / "leaf.crt", d / "ext.cnf"
    ext.write_text(f"subjectAltName=DNS:{host}\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", csr, "-subj", f"/CN={host}")  # fmt: skip
    _openssl("x509", "-req", "-in", csr, "-CA", ca[1], "-CAkey", ca[0], "-CAcreateserial",
             "-out", crt, "-days", "2", "-extfile", ext)  # fmt: skip
    return key, crt


def _handshake(ctx: ssl.SSLContext, leaf: tuple[Path, Path], name: str) -> str:
    """A TLS server on loopback serving ``leaf``; "" when the client's handshake verified,
    else the client's error."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(leaf[1], leaf[0])
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]

    def serve() -> None:
        conn, _ = lsock.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError):
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname=name) as s,
        ):
            s.sendall(b"x")
        return ""
    except ssl.SSLError as e:
        return str(e)
    finally:
        t.join(10)
        lsock.close()


def test_the_hashed_directory_verifies_and_refuses(tmp_path: Path) -> None:
    trusted, other, certs = tmp_path / "t", tmp_path / "o", tmp_path / "certs"
    for d in (trusted, other, certs):
        d.mkdir()
    ca = _ca(trusted, "pdboot-test-ca")
    h = _openssl("x509", "-subject_hash", "-noout", "-in", ca[1]).strip()
    os.symlink(ca[1], certs / f"{h}.0")  # what update-ca-certificates / openssl rehash write
    paths = ssl.DefaultVerifyPaths(
        None, str(certs), "SSL_CERT_FILE", "/nonexistent", "SSL_CERT_DIR", str(certs)
    )
    assert http.ca_dir(paths, {}) == str(certs)
    ctx = ssl.create_default_context(capath=http.ca_dir(paths, {}))
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.cert_store_stats()["x509_ca"] == 0  # nothing parsed up front

    assert _handshake(ctx, _leaf(trusted, ca, "registry.test"), "registry.test") == ""
    assert "certificate verify failed" in _handshake(
        ctx, _leaf(trusted, ca, "registry.test"), "other.test"
    )
    stranger = _ca(other, "not-trusted-ca")
    assert "certificate verify failed" in _handshake(
        ctx, _leaf(other, stranger, "registry.test"), "registry.test"
    )


@pytest.mark.parametrize("case", ["bundle chosen", "no hashed names", "no directory"])
def test_the_bundle_is_kept_where_the_directory_would_not_be_the_same(
    tmp_path: Path, case: str
) -> None:
    (tmp_path / "ca-certificates.crt").write_text("")
    capath = None if case == "no directory" else str(tmp_path)
    paths = ssl.DefaultVerifyPaths(
        None, capath, "SSL_CERT_FILE", "/x", "SSL_CERT_DIR", str(tmp_path)
    )
    if case == "bundle chosen":
        (tmp_path / "abcdef01.0").write_text("")
        assert http.ca_dir(paths, {"SSL_CERT_FILE": "/etc/my-ca.pem"}) is None
        assert http.ca_dir(paths, {}) == str(tmp_path)
    else:
        assert http.ca_dir(paths, {}) is None
