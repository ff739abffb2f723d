"""preflight's tls.certificate refuses a router.tls.key file its group or others may read,
with the fix (the endpoint's private key is its owner's alone, like secrets). Real files in a
temporary directory."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from pdboot.inventory.schema import Inventory
from pdboot.preflight.checks import tls
from tests.unit.builders import inventory
from tests.unit.plan.test_proxy import pem_pair


def _inv(cert: Path, key: str) -> Inventory:
    hosts = {"a": "192.0.2.10", "b": "192.0.2.11"}
    tls_ref = {"cert": f"file:{cert}", "key": key}
    return inventory(hosts, ["a"], ["b"], "a", overrides={"router.tls": tls_ref})


def test_a_key_file_readable_by_others_fails_with_chmod_600(tmp_path: Path) -> None:
    cert_pem, key_pem, _ = pem_pair(days=400)
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text(cert_pem)
    cert.chmod(0o644)  # a certificate is public
    key.write_text(key_pem)
    now = datetime.now(timezone.utc)
    for mode in (0o644, 0o640, 0o604, 0o660):
        key.chmod(mode)
        [r] = tls.evaluate(_inv(cert, f"file:{key}"), now)
        assert r.status == "fail" and f"(mode {mode:o})" in r.message, r
        assert r.fix == f"chmod 600 {key}" and "BEGIN" not in r.message
    for mode in (0o600, 0o400):
        key.chmod(mode)
        [r] = tls.evaluate(_inv(cert, f"file:{key}"), now)
        assert r.status == "pass", r


def test_a_key_in_the_environment_has_no_file_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert_pem, key_pem, _ = pem_pair(days=400)
    cert = tmp_path / "c.pem"
    cert.write_text(cert_pem)
    monkeypatch.setenv("TLS_KEY", key_pem)
    [r] = tls.evaluate(_inv(cert, "env:TLS_KEY"), datetime.now(timezone.utc))
    assert r.status == "pass", r
