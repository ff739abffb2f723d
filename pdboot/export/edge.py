"""The edge of an exported deployment (pure): pdboot's proxy (plan/proxy.py's nginx.conf, the
same generator `up` ships) in front of the router, which keeps `render`'s loopback address.

vllm-router serves its worker API (``/workers``, ``/add_worker``, ``/remove_worker``) on the
port of ``/v1`` with no authentication: on SSH hosts the proxy closes it and checks the API
key; an export without the proxy would open both again. So on Slurm the proxy runs on the
router's node and the router on that node's loopback; on Kubernetes the proxy is a sidecar in
the router's pod and the Service reaches only the proxy's port.

The key's include (``auth.conf``) holds the secret, so the exported files never carry it:
the proxy's container writes it (0600) from the deployment's secret when it starts, then
runs nginx. The key is refused there as `pdboot up` refuses it (spaces, quotes, backslash,
``$`` or a backquote: secret_refs.py), so nginx's quoted string cannot be broken out of.
"""

from __future__ import annotations

from pdboot.export.common import ExportError
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import PROXY_CONF_FILE
from pdboot.plan.proxy import (
    MAX_API_KEY_CHARS,
    PROXY_AUTH_IN_CONTAINER,
    PROXY_CONF_IN_CONTAINER,
    PROXY_DIR_IN_CONTAINER,
    proxy_auth_text,
    proxy_files,
)

__all__ = [
    "PROXY_CONF_IN_CONTAINER",
    "PROXY_DIR_IN_CONTAINER",
    "key_from_env_file",
    "proxy_conf",
    "proxy_start",
]


def key_from_env_file(path: str) -> str:
    """Shell lines that set ``key`` from an env file's VLLM_API_KEY= line (the last one)."""
    return "\n".join(
        [
            "key=",
            'while IFS= read -r line || [ -n "$line" ]; do',
            "  case $line in VLLM_API_KEY=*) key=${line#VLLM_API_KEY=} ;; esac",
            f"done <{path}",
        ]
    )


def proxy_conf(inv: Inventory) -> str:
    """nginx.conf as `up` ships it (no key: that file is written where the proxy runs)."""
    if inv.router.tls is not None:
        raise ExportError(
            "router.tls is not exported: the certificate and key would have to reach the "
            "nodes by a path of the site's; terminate TLS at the site's ingress or load "
            "balancer in front of the exported endpoint, and remove router.tls"
        )
    return proxy_files(inv, None)[PROXY_CONF_FILE]


def _auth_format() -> str:
    """plan/proxy.py's key include as a printf format (the key its one argument): the same
    text `up` ships, so the exported proxy compares exactly as the SSH hosts' does."""
    return proxy_auth_text("%s").rstrip("\n") + "\\n"


def proxy_start(inv: Inventory, read_key: str) -> str:
    """The proxy container's `sh -c` program (POSIX sh builtins only: a minimal image has no
    sed): with an API key, ``read_key`` (shell lines that set ``key`` in the container) and
    its include written from it, then nginx."""
    run = f"exec nginx -c {PROXY_CONF_IN_CONTAINER}"
    if inv.secrets.api_key is None:
        return run
    return "\n".join(
        [
            "set -eu",
            "umask 077",
            read_key,
            "case $key in",
            "'' | *[[:space:]\\\"\\'\\\\\\$\\`]*)",
            '  echo "pdboot proxy: no usable VLLM_API_KEY (empty, or spaces, quotes or $)" >&2',
            "  exit 1",
            "  ;;",
            "esac",
            f"if [ ${{#key}} -gt {MAX_API_KEY_CHARS} ]; then",
            f'  echo "pdboot proxy: VLLM_API_KEY is over {MAX_API_KEY_CHARS} characters" >&2',
            "  exit 1",
            "fi",
            f"printf '{_auth_format()}' \"$key\" >{PROXY_AUTH_IN_CONTAINER}",
            run,
        ]
    )
