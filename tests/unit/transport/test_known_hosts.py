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
    load_known_hosts,
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


def test_a_file_is_parsed_once_until_it_changes(
    tmp_path: Path, keys: dict[str, paramiko.PKey]
) -> None:
    f = tmp_path / "kh"
    f.write_text(_line("gpu-a", keys["good"]) + "\n")
    first = load_known_hosts(str(f))
    assert load_known_hosts(str(f)) is first  # every connect of a run reads the same file
    with f.open("a") as out:  # what accept-new does: a line appended
        out.write(_line("gpu-b", keys["other"]) + "\n")
    again = load_known_hosts(str(f))
    assert again is not first and {n for n, _ in again.keys} == {"gpu-a", "gpu-b"}
    f.unlink()
    assert load_known_hosts(str(f)).keys == []


def test_a_named_client_gets_its_own_and_the_hashed_lines_and_still_sees_a_changed_key(
    tmp_path: Path, keys: dict[str, paramiko.PKey]
) -> None:
    hashed = paramiko.HostKeys.hash_host("[gpu-d]:2222")
    f = tmp_path / "kh"
    f.write_text(
        "\n".join(
            [
                _line("gpu-a,10.0.0.1", keys["good"]),
                _line("gpu-b", keys["other"]),
                _line(hashed, keys["ca"]),
                "",
            ]
        )
    )
    client = paramiko.SSHClient()
    _strict(client, str(f), accept_new=False, name="gpu-a")
    hk = client.get_host_keys()
    assert hk.lookup("gpu-a") is not None and hk.lookup("gpu-b") is None
    assert hk.lookup("[gpu-d]:2222") is not None  # a hashed line may be anyone's
    # the check paramiko makes after the key exchange: the same key type, another key
    assert hk.check("gpu-a", keys["good"]) and not hk.check("gpu-a", keys["other"])
    everyone = paramiko.SSHClient()
    _strict(everyone, str(f), accept_new=False)
    assert everyone.get_host_keys().lookup("gpu-b") is not None
