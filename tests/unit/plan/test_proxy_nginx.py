"""The proxy's rendered files (plan/proxy.py `proxy_files`) pass the real `nginx -t`: with API
keys of 16, 64 (`openssl rand -hex 32`), 128 and the longest pdboot serves, with TLS, and
without a key. A key of 40 characters or more once stopped nginx from starting (a string `map`
needs a hash bucket as long as the key). Debian's nginx 1.22 here; the deployment runs the
official nginx image (router.proxy_image), whose release is newer."""

from __future__ import annotations

import secrets
import string
from pathlib import Path

import pytest

from pdboot.inventory.schema import Inventory
from pdboot.plan.proxy import MAX_API_KEY_CHARS, proxy_files
from tests.testbed.nginx_local import localize, nginx_test
from tests.unit.builders import inventory
from tests.unit.plan.test_proxy import pem_pair

# every character read_secret lets through, upper and lower case among them
KEY_CHARS = string.ascii_letters + string.digits + "-._~+/=!#%&()*,:;<>?@[]^{|}"


def _key(n: int) -> str:
    return "".join(secrets.choice(KEY_CHARS) for _ in range(n))


def _inv(**overrides: object) -> Inventory:
    hosts = {"a": "192.0.2.10", "b": "192.0.2.11"}
    return inventory(hosts, ["a"], ["b"], "a", overrides=overrides)


@pytest.mark.parametrize("length", [16, 64, 128, MAX_API_KEY_CHARS])
def test_nginx_accepts_the_conf_with_a_key_of(length: int, tmp_path: Path) -> None:
    files = proxy_files(_inv(**{"secrets.api_key": "env:K"}), _key(length))
    done = nginx_test(localize(files, tmp_path))
    assert done.returncode == 0, done.stderr


def test_nginx_accepts_the_conf_with_tls_and_without_a_key(tmp_path: Path) -> None:
    cert, key, _ = pem_pair()
    inv = _inv(**{"router.tls": {"cert": "file:/c.pem", "key": "env:TLS_KEY"}})
    done = nginx_test(localize(proxy_files(inv, None, (cert, key)), tmp_path))
    assert done.returncode == 0, done.stderr


def test_nginx_accepts_the_conf_with_the_smallest_limits(tmp_path: Path) -> None:
    limits = {
        "connections_per_client": 1,
        "requests_per_second_per_client": 1,
        "request_burst_per_client": 0,
        "small_body_kb": 1,
        "header_timeout_secs": 1,
        "body_timeout_secs": 1,
    }
    files = proxy_files(_inv(**{"router.proxy_limits": limits}), None)
    assert "limit_req zone=pdboot_req;" in files["proxy-nginx.conf"]  # no burst=0
    done = nginx_test(localize(files, tmp_path))
    assert done.returncode == 0, done.stderr


def test_nginx_test_fails_a_broken_conf(tmp_path: Path) -> None:
    """The check can fail: a conf nginx refuses is reported as such."""
    files = proxy_files(_inv(), None)
    files["proxy-nginx.conf"] = files["proxy-nginx.conf"].replace("listen", "listne", 1)
    done = nginx_test(localize(files, tmp_path))
    assert done.returncode != 0 and "listne" in done.stderr
