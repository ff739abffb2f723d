"""known_hosts files with OpenSSH's marker lines (@cert-authority, @revoked): paramiko's
own loader fails on them with InvalidHostKey; pdboot skips what it cannot use, says so,
and refuses revoked keys."""

from __future__ import annotations

import logging
from pathlib import Path

import paramiko
import pytest

from pdboot.transport.known_hosts import (
    RevokedHostKey,
    UnknownHostKey,
    _strict,
    classify,
    is_revoked,
    parse_known_hosts,
)


def _key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


def _line(names: str, key: paramiko.PKey) -> str:
    return f"{names} {key.get_name()} {key.get_base64()}"


@pytest.fixture()
def keys() -> dict[str, paramiko.PKey]:
    return {n: _key() for n in ("good", "revoked", "ca", "other")}


def _text(k: dict[str, paramiko.PKey]) -> str:
    return "\n".join(
        [
            "# a comment",
            _line("@cert-authority *.example.com", k["ca"]),
            _line("gpu-a,10.0.0.1", k["good"]),
            _line("@revoked *", k["revoked"]),
            _line("gpu-b", k["revoked"]),  # listed AND revoked: revoked wins
            "gpu-c ssh-ed25519 !!!notbase64!!!",
            "@frobnicate x y z",
            "",
        ]
    )


def test_paramiko_alone_cannot_read_such_a_file(
    tmp_path: Path, keys: dict[str, paramiko.PKey]
) -> None:
    f = tmp_path / "kh"
    f.write_text(_text(keys))
    with pytest.raises(Exception, match=r"key|Invalid|padding"):
        paramiko.HostKeys().load(str(f))


def test_parse_keeps_keys_skips_markers_and_records_revoked(keys: dict[str, paramiko.PKey]) -> None:
    kh = parse_known_hosts(_text(keys))
    assert ("gpu-a", keys["good"]) in [(n, k) for n, k in kh.keys]
    assert {n for n, _ in kh.keys} == {"gpu-a", "10.0.0.1", "gpu-b"}
    assert is_revoked(kh, keys["revoked"]) and not is_revoked(kh, keys["good"])
    assert kh.has_cert_authority
    assert [n for n, _ in kh.skipped] == [2, 6, 7]
    assert "host certificates are not supported" in kh.skipped[0][1]


def test_strict_client_refuses_a_revoked_key_even_when_listed(
    tmp_path: Path, keys: dict[str, paramiko.PKey], caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "kh"
    f.write_text(_text(keys))
    client = paramiko.SSHClient()
    with caplog.at_level(logging.WARNING, logger="pdboot.transport.known_hosts"):
        _strict(client, str(f), accept_new=True)
    assert f"{f}:2: line skipped: @cert-authority" in caplog.text
    hk = client.get_host_keys()
    assert hk.lookup("gpu-a") is not None and hk.lookup("gpu-b") is None
    policy = client._policy
    with pytest.raises(RevokedHostKey) as ei:
        policy.missing_host_key(client, "gpu-b", keys["revoked"])
    e = classify(ei.value, "b")
    assert e.kind == "host_key_changed" and "@revoked" in e.message
    assert keys["revoked"].fingerprint in e.message
    # accept-new never records a revoked key
    assert f.read_text() == _text(keys)


def test_unknown_key_with_cert_authority_lines_explains_why(
    tmp_path: Path, keys: dict[str, paramiko.PKey]
) -> None:
    f = tmp_path / "kh"
    f.write_text(_text(keys))
    client = paramiko.SSHClient()
    _strict(client, str(f), accept_new=False)
    with pytest.raises(UnknownHostKey) as ei:
        client._policy.missing_host_key(client, "h.example.com", keys["other"])
    e = classify(ei.value, "h")
    assert e.kind == "host_key"
    assert "@cert-authority" in e.message and "no host certificate support" in e.message
