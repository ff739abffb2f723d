"""The proxy in front of the router (plan/proxy.py): its nginx.conf, the key check and TLS
files, and preflight's tls.certificate (issue 28). nginx itself runs in the testbed tests
(tests/e2e/test_api_key_secrets.py, test_proxy_tls.py)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.model import PRIVATE_FILES
from pdboot.plan.proxy import (
    ADMIN_PATHS,
    CLIENT_METHODS,
    OPEN_METHODS,
    REFUSED_TARGETS,
    proxy_auth_text,
    proxy_conf_text,
    proxy_files,
)
from pdboot.preflight.checks.tls import evaluate_pair
from tests.unit.builders import inventory

ROUTER = {"router.request_timeout_secs": 600, "router.max_request_mb": 8}


def demo(**overrides: Any) -> Inventory:
    """Two hosts, the router on a with a 600 s timeout and an 8 MB body limit."""
    hosts = {"a": "192.0.2.10", "b": "192.0.2.11"}
    return inventory(hosts, ["a"], ["b"], "a", overrides={**ROUTER, **overrides})


NOW = datetime(2026, 12, 4, tzinfo=timezone.utc)


def pem_pair(days: int = 90, start: int = -1) -> tuple[str, str, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "endpoint.test")])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(NOW + timedelta(days=start)).not_valid_after(NOW + timedelta(days=days))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem, key


def test_conf_forwards_the_client_api_only_and_applies_the_limits() -> None:
    inv = demo()
    text = proxy_conf_text(inv)
    assert "listen 8000;" in text and "server 127.0.0.1:8081;" in text
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health"):
        assert f"location = {path} {{" in text
    assert "location / {\n            return 404" in text  # /workers, /add_worker, ...
    assert "/workers" in ADMIN_PATHS and "/add_worker" in ADMIN_PATHS
    assert "proxy_buffering off;" in text and "proxy_read_timeout 600s;" in text
    assert "client_max_body_size 8m;" in text and "$remote_addr" in text
    assert "pdboot_api_key" not in text  # no key: no check
    assert set(proxy_files(inv, None)) == {"proxy-nginx.conf"}


def test_with_a_key_the_conf_includes_a_0600_file_and_never_holds_the_key() -> None:
    inv = demo(**{"secrets.api_key": "env:K"})
    text = proxy_conf_text(inv)
    assert "include /etc/pdboot-proxy/auth.conf;" in text and text.count("return 401") == 3
    # the whole header against the whole key, as strings: exact, case-sensitive, any length
    assert text.count('if ($http_authorization != "Bearer $pdboot_api_key") {') == 3
    files = proxy_files(inv, "k-123")
    assert "k-123" not in files["proxy-nginx.conf"]
    assert files["proxy-auth.conf"] == 'set $pdboot_api_key "k-123";\n'
    assert "proxy-auth.conf" in PRIVATE_FILES
    assert proxy_auth_text('a"b') == 'set $pdboot_api_key "a\\"b";\n'
    plan = build_plan(inv)
    assert plan.proxy is not None and not plan.proxy.uses_secrets


def test_tls_listens_with_ssl_ships_the_pair_0600_and_the_endpoint_is_https() -> None:
    inv = demo(**{"router.tls": {"cert": "file:/etc/pdboot/c.pem", "key": "env:TLS_KEY"}})
    text = proxy_conf_text(inv)
    assert "listen 8000 ssl;" in text and "ssl_certificate_key /etc/pdboot-proxy/tls.key;" in text
    files = proxy_files(inv, None, ("CERT", "KEY"))
    assert files["proxy-tls.crt"] == "CERT" and files["proxy-tls.key"] == "KEY"
    assert {"proxy-tls.crt", "proxy-tls.key"} <= PRIVATE_FILES
    plan = build_plan(inv)
    assert plan.endpoint == "https://192.0.2.10:8000"
    assert plan.router.url == "http://127.0.0.1:8081"  # behind the proxy: plain, loopback


def test_preflight_checks_the_pair_and_its_dates() -> None:
    cert, key, _ = pem_pair()
    ok = evaluate_pair(cert, key, NOW)
    assert ok.status == "pass" and "key matches" in ok.message
    _, other, _ = pem_pair()
    assert evaluate_pair(cert, other, NOW).status == "fail"
    old, old_key, _ = pem_pair(days=-1, start=-30)
    gone = evaluate_pair(old, old_key, NOW)
    assert gone.status == "fail" and "expired" in gone.message
    soon, soon_key, _ = pem_pair(days=5)
    assert evaluate_pair(soon, soon_key, NOW).status == "warn"
    assert evaluate_pair("junk", key, NOW).status == "fail"


def test_each_served_path_forwards_itself_with_its_one_method() -> None:
    text = proxy_conf_text(demo(**{"secrets.api_key": "env:K"}))
    served = {**OPEN_METHODS, **CLIENT_METHODS}
    assert served == {
        "/health": "GET",
        "/v1/models": "GET",
        "/v1/completions": "POST",
        "/v1/chat/completions": "POST",
    }
    for path, method in served.items():
        block = text.split(f"location = {path} {{")[1].split("\n        }")[0]
        assert f"if ($request_method != {method}) {{" in block
        assert f'add_header Allow "{method}" always;' in block and "return 405" in block
        # the URI spelled out: never the client's raw target
        assert f"proxy_pass http://$pdboot_upstream{path}$is_args$args;" in block
        assert ("$pdboot_api_key" in block) == (path != "/health")
    assert text.count("proxy_pass") == len(served)  # nothing else is forwarded


def _refused(request_line: str) -> str:
    """What the conf's map says of a request line ("" = canonical), by the same regexes
    (PCRE and Python's re agree on these), first match wins as in nginx's map."""
    return next((why for why, rx in REFUSED_TARGETS if re.search(rx, request_line)), "")


def test_a_target_not_in_canonical_form_is_refused_before_any_location() -> None:
    text = proxy_conf_text(demo())
    server = text.split("    server {")[1]
    assert server.index("if ($pdboot_refused)") < server.index("location =")
    ok = [
        "GET /health HTTP/1.1",
        "POST /v1/completions?a=%2F.. HTTP/1.1",
        "GET /v1/models HTTP/1.0",
    ]
    assert [_refused(r) for r in ok] == ["", "", ""]
    bad = {
        "POST /x%2F..%2Fhealth HTTP/1.1": "percent",
        "DELETE /workers/x%2f..%2f..%2fhealth HTTP/1.1": "percent",
        "GET /%2e%2e/health HTTP/1.1": "percent",
        "GET /%68ealth HTTP/1.1": "percent",
        "GET /health#x HTTP/1.1": "#",
        "GET /v1\\models HTTP/1.1": "backslash",
        "GET /a/../health HTTP/1.1": "dot segment",
        "GET /health/. HTTP/1.1": "dot segment",
        "GET /v1/models/..?x HTTP/1.1": "dot segment",
        "GET /./health HTTP/1.1": "dot segment",
        "GET //health HTTP/1.1": "empty path segment",
        "GET http://evil/health HTTP/1.1": "absolute-form",
        "OPTIONS * HTTP/1.1": "absolute-form",
    }
    for line, why in bad.items():
        assert why in _refused(line), line
    assert _refused("GET /v1/models.. HTTP/1.1") == ""  # dots inside a segment are a name


def test_limits_come_from_the_inventory_and_apply_before_the_router() -> None:
    text = proxy_conf_text(demo())
    assert "limit_conn pdboot_conn 1024;" in text  # the defaults
    assert "limit_req zone=pdboot_req burst=2000 nodelay;" in text and "rate=1000r/s;" in text
    assert "client_header_timeout 10s;" in text and "client_body_timeout 30s;" in text
    limits = {
        "connections_per_client": 7,
        "requests_per_second_per_client": 9,
        "request_burst_per_client": 3,
        "small_body_kb": 2,
        "header_timeout_secs": 4,
        "body_timeout_secs": 5,
    }
    text = proxy_conf_text(demo(**{"router.proxy_limits": limits}))
    assert "limit_conn pdboot_conn 7;" in text and "limit_conn_status 429;" in text
    assert "rate=9r/s;" in text and "burst=3 nodelay;" in text and "limit_req_status 429;" in text
    assert "client_header_timeout 4s;" in text and "client_body_timeout 5s;" in text
    # small bodies on the GET paths, router.max_request_mb on the completions
    for path in ("/health", "/v1/models"):
        block = text.split(f"location = {path} {{")[1].split("\n        }")[0]
        assert "client_max_body_size 2k;" in block
    for path in ("/v1/completions", "/v1/chat/completions"):
        block = text.split(f"location = {path} {{")[1].split("\n        }")[0]
        assert "client_max_body_size" not in block
    assert "    client_max_body_size 8m;" in text
    # bodies stream to the router: never buffered to disk
    assert "proxy_request_buffering off;" in text


def test_tls_is_mozillas_intermediate_profile_without_tickets() -> None:
    inv = demo(**{"router.tls": {"cert": "file:/etc/pdboot/c.pem", "key": "env:TLS_KEY"}})
    text = proxy_conf_text(inv)
    assert "ssl_protocols TLSv1.2 TLSv1.3;" in text and "ssl_session_tickets off;" in text
    ciphers = text.split("ssl_ciphers ")[1].split(";")[0].split(":")
    assert ciphers and all(c.startswith("ECDHE-") for c in ciphers)
    assert all("GCM" in c or "CHACHA20-POLY1305" in c for c in ciphers)
