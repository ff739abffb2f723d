"""The reverse proxy that owns the public endpoint (issue 28): nginx on ``router.port`` of the
router host, in front of the router, which listens only on that host's loopback
(``router.internal_port``).

Why: vllm-router 0.1.17 in gateway mode (`--enable-igw`, live workers) serves its worker API
(``/workers*``, ``/add_worker``, ``/remove_worker``) on the same port as ``/v1`` and has no
way to authenticate a caller; anyone who reached the endpoint could register their own
servers or remove every engine. The proxy forwards only GET /health, GET /v1/models and POST
/v1/completions and /v1/chat/completions, each as that fixed path (plus the client's query),
refuses a request target not in canonical form (400), another method (405) and every other
path (404), checks ``secrets.api_key`` exactly (401 without it), streams unbuffered (SSE token
by token), bounds each request by ``router.request_timeout_secs`` and its body by
``router.max_request_mb``, and logs each client's address. Only the router host reaches the
worker API: pdboot over a channel of its SSH connection, the watch service beside the router.
docs/security.md says what the edge forwards, exactly.

Pure: the text of nginx.conf and of the key's include file; `up` ships both beside
compose.yaml (the key's file 0600, like secrets.env). `proxy_files` is the one place the
proxy's files come from: exports and a standby ingress render the edge through it.
"""

from __future__ import annotations

import hashlib

from pdboot.inventory.rules import advertised_address
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import (
    PROXY_AUTH_FILE,
    PROXY_CONF_FILE,
    PROXY_TLS_CERT,
    PROXY_TLS_KEY,
    BindMount,
    Service,
)
from pdboot.plan.privileges import ALL, proxy_caps

# Where the router listens on its host (host networking): loopback only.
ROUTER_INTERNAL_ADDRESS = "127.0.0.1"
PROXY_DIR_IN_CONTAINER = "/etc/pdboot-proxy"
PROXY_CONF_IN_CONTAINER = f"{PROXY_DIR_IN_CONTAINER}/nginx.conf"
PROXY_AUTH_IN_CONTAINER = f"{PROXY_DIR_IN_CONTAINER}/auth.conf"
PROXY_CERT_IN_CONTAINER = f"{PROXY_DIR_IN_CONTAINER}/tls.crt"
PROXY_KEY_IN_CONTAINER = f"{PROXY_DIR_IN_CONTAINER}/tls.key"
PROXY_PID = "/tmp/pdboot-nginx.pid"  # noqa: S108 - inside the container; `nginx -s reload` reads it

# What the endpoint serves, and with which method: vLLM's OpenAI-compatible paths pdboot's
# endpoint is for, and the router's /health (load balancers probe it; no key, it says nothing
# but "ok"). A served path asked with another method answers 405 (with Allow), any other path
# 404; neither reaches the router.
CLIENT_METHODS = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/models": "GET",
}
OPEN_METHODS = {"/health": "GET"}  # no key asked
CLIENT_PATHS = tuple(CLIENT_METHODS)
# The router's admin surface, named so the 404 is a decision, not an accident: every path not
# in CLIENT_PATHS gets the same answer.
ADMIN_PATHS = ("/workers", "/workers/<url>", "/add_worker", "/remove_worker", "/list_workers")

# The longest secrets.api_key pdboot serves. The key is compared as a string (no hash table,
# no regex), so what bounds it is nginx's own reading: one token of the config file (the
# include's `set`) must fit its 4 KiB parse buffer, and a client's "Authorization: Bearer
# <key>" line one of its large_client_header_buffers (8k, set below). 1024 is far above any
# generated key (`openssl rand -hex 32`: 64) and well inside both. preflight and `up` refuse a
# longer key naming this number (transport/secret_refs.read_api_key).
MAX_API_KEY_CHARS = 1024

# The request line's target as the client sent it, before nginx normalizes it (nginx matches
# locations on the decoded, dot-resolved path): a target that is not already in the one
# canonical spelling is refused with 400, whatever its path, so what the location matched is
# what the client wrote. Checked in order, on the path only (the query is forwarded as sent).
REFUSED_TARGETS = (
    ("absolute-form or asterisk-form target", r"^[A-Z]+ [^/]"),
    ("percent-encoding, # or backslash in the path", r"^[A-Z]+ [^ ?]*[%#\\]"),
    ("empty path segment", r"^[A-Z]+ [^ ?]*//"),
    ("dot segment", r"^[A-Z]+ [^ ?]*/\.\.?(/|\?| |$)"),
)


# TLS 1.2's ciphers (Mozilla's intermediate profile without its DHE suites): forward secrecy
# (ECDHE) and authenticated encryption (GCM, ChaCha20-Poly1305) only. TLS 1.3's are all AEAD.
TLS12_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
)


# Which router the proxy forwards to (deploy/router_swap.py): the home one (router.internal_port)
# unless the route file, written inside the proxy's container during a swap, names the spare
# (router.swap_port). A glob include: no file, no route, home. The file lives in the
# container's /tmp, never on the host: a restarted proxy forgets it and forwards home, where
# the router runs outside a swap; `up`'s shipped nginx.conf never changes for a swap, so a
# swap neither needs a file on the host (a bind mount pins the old inode) nor changes the
# proxy's config hash.
UPSTREAM_HOME = "pdboot_router"
UPSTREAM_SPARE = "pdboot_router_swap"
ROUTE_FILE = "/tmp/pdboot-route.conf"  # noqa: S108 - inside the container
ROUTE_GLOB = "/tmp/pdboot-route*.conf"  # noqa: S108 - inside the container


def route_text(upstream: str) -> str:
    """The route file's text: the upstream requests go to."""
    return f"set $pdboot_upstream {upstream};\n"


def proxy_conf_text(inv: Inventory) -> str:
    """nginx.conf for the proxy: both routers' upstreams, home by default."""
    r = inv.router
    lim = r.proxy_limits
    keyed = inv.secrets.api_key is not None
    lines = [
        *_http_head(inv),
        f"    upstream {UPSTREAM_HOME} {{",
        f"        server {ROUTER_INTERNAL_ADDRESS}:{r.internal_port};",
        "        keepalive 64;",
        "    }",
        "    # a router change: its successor, until the home router runs the new settings",
        f"    upstream {UPSTREAM_SPARE} {{",
        f"        server {ROUTER_INTERNAL_ADDRESS}:{r.swap_port};",
        "        keepalive 64;",
        "    }",
        "    server {",
        *_listen(inv),
        "        # before any location: a target not in canonical form never matches one",
        "        if ($pdboot_refused) {",
        '            return 400 \'{"error": "request target refused: $pdboot_refused"}\\n\';',
        "        }",
        f"        set $pdboot_upstream {UPSTREAM_HOME};",
        f"        include {ROUTE_GLOB};",
        *(
            [
                "        # secrets.api_key: set in the 0600 include, never in this file",
                f"        include {PROXY_AUTH_IN_CONTAINER};",
            ]
            if keyed
            else []
        ),
        "        # per client address: requests in flight and the request rate (429 over them);",
        "        # a refused request (400, 401, 404, 405) is answered before either is counted",
        f"        limit_conn pdboot_conn {lim.connections_per_client};",
        _limit_req(lim.request_burst_per_client),
        "        # bodies stream to the router as they arrive: none is written to disk",
        "        proxy_request_buffering off;",
        "        proxy_http_version 1.1;",
        '        proxy_set_header Connection "";',
        "        proxy_set_header Host $host;",
        "        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "        proxy_set_header X-Real-IP $remote_addr;",
        "        # SSE: every token as the router sends it",
        "        proxy_buffering off;",
        "        proxy_cache off;",
        "        proxy_connect_timeout 10s;",
        f"        proxy_read_timeout {r.request_timeout_secs}s;",
        f"        proxy_send_timeout {r.request_timeout_secs}s;",
    ]
    small = f"{lim.small_body_kb}k"
    for path, method in OPEN_METHODS.items():
        lines += _location(path, method, keyed=False, body=small)
    for path, method in CLIENT_METHODS.items():
        lines += _location(path, method, keyed=keyed, body=small if method == "GET" else "")
    lines += [
        "        location / {",
        '            return 404 \'{"error": "not found"}\\n\';',
        "        }",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _limit_req(burst: int) -> str:
    """The rate limit: a burst above the rate served at once (nginx refuses `burst=0`)."""
    extra = f" burst={burst} nodelay" if burst else ""
    return f"        limit_req zone=pdboot_req{extra};"


def _location(path: str, method: str, keyed: bool, body: str) -> list[str]:
    """One served path: its one method (405 otherwise), the key when asked for, then the
    path itself forwarded: a proxy_pass with a variable and no URI would pass the client's
    raw target, so the URI is spelled out (the query, as sent, after it). ``body``: its own
    body limit ("" : the server's, router.max_request_mb)."""
    out = [
        f"        location = {path} {{",
        *([f"            client_max_body_size {body};"] if body else []),
        f"            if ($request_method != {method}) {{",
        f'                add_header Allow "{method}" always;',
        '                return 405 \'{"error": "method not allowed"}\\n\';',
        "            }",
    ]
    if keyed:
        out += [
            '            if ($http_authorization != "Bearer $pdboot_api_key") {',
            '                add_header WWW-Authenticate "Bearer" always;',
            '                return 401 \'{"error": "missing or wrong API key"}\\n\';',
            "            }",
        ]
    forward = f"            proxy_pass http://$pdboot_upstream{path}$is_args$args;"
    return [*out, forward, "        }"]


def _http_head(inv: Inventory) -> list[str]:
    """Process settings, logs (each client's address), temp paths, size limits, and the
    map that names a refused request target."""
    r = inv.router
    lim = r.proxy_limits
    refused = [
        f"        {_nginx_quote('~' + rx)} {_nginx_quote(why)};" for why, rx in REFUSED_TARGETS
    ]
    return [
        "# Generated by pdboot; do not edit (`pdboot up` overwrites it).",
        "# The public endpoint: only GET /health, GET /v1/models and POST /v1/completions and",
        "# /v1/chat/completions reach the router, each as exactly that path; its worker API",
        f"# ({', '.join(ADMIN_PATHS)})",
        "# and every other path answer 404, another method 405, a target not in canonical",
        "# form 400.",
        "daemon off;",
        "worker_processes 2;",
        f"pid {PROXY_PID};",
        "error_log stderr warn;",
        "events {",
        "    worker_connections 4096;",
        "}",
        "http {",
        "    server_tokens off;",
        "    default_type application/json;",
        "    log_format pdboot '$remote_addr [$time_local] \"$request\" $status '",
        "                      '$body_bytes_sent $request_time';",
        "    access_log /dev/stdout pdboot;",
        "    client_body_temp_path /tmp/nginx-body;",
        "    proxy_temp_path /tmp/nginx-proxy;",
        "    fastcgi_temp_path /tmp/nginx-fastcgi;",
        "    uwsgi_temp_path /tmp/nginx-uwsgi;",
        "    scgi_temp_path /tmp/nginx-scgi;",
        f"    client_max_body_size {r.max_request_mb}m;",
        "    client_body_buffer_size 64k;",
        f"    client_header_timeout {lim.header_timeout_secs}s;",
        f"    client_body_timeout {lim.body_timeout_secs}s;",
        "    lingering_time 30s;",
        "    limit_conn_zone $binary_remote_addr zone=pdboot_conn:10m;",
        f"    limit_req_zone $binary_remote_addr zone=pdboot_req:10m "
        f"rate={lim.requests_per_second_per_client}r/s;",
        "    limit_conn_status 429;",
        "    limit_req_status 429;",
        f"    # a key of up to {MAX_API_KEY_CHARS} characters fits one header buffer",
        "    large_client_header_buffers 4 8k;",
        "    # the request line as sent -> why its target is refused (empty: canonical)",
        "    map $request $pdboot_refused {",
        '        default "";',
        *refused,
        "    }",
    ]


def _listen(inv: Inventory) -> list[str]:
    r = inv.router
    if r.tls is None:
        return [f"        listen {r.port};"]
    return [
        f"        listen {r.port} ssl;",
        f"        ssl_certificate {PROXY_CERT_IN_CONTAINER};",
        f"        ssl_certificate_key {PROXY_KEY_IN_CONTAINER};",
        "        # Mozilla's intermediate profile: TLS 1.3, and 1.2 with ECDHE + AEAD only",
        "        ssl_protocols TLSv1.2 TLSv1.3;",
        f"        ssl_ciphers {':'.join(TLS12_CIPHERS)};",
        "        ssl_prefer_server_ciphers off;",
        "        ssl_ecdh_curve X25519:prime256v1:secp384r1;",
        "        ssl_session_timeout 1d;",
        "        ssl_session_cache shared:pdboot_tls:10m;",
        "        # tickets are encrypted with a key nginx never rotates: no forward secrecy",
        "        ssl_session_tickets off;",
    ]


def _nginx_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def proxy_auth_text(api_key: str) -> str:
    """The include of the key (shipped 0600): the one value of ``$pdboot_api_key``, which
    each client location compares with the whole Authorization header, exactly (a string
    compare: case-sensitive, any length; nginx's `map` would lowercase the key and need a
    hash bucket as long as it). read_secret already refused keys with spaces, quotes,
    backslashes or ``$`` (a variable inside nginx's string)."""
    return f"set $pdboot_api_key {_nginx_quote(api_key)};\n"


def proxy_files(
    inv: Inventory, api_key: str | None, tls: tuple[str, str] | None = None
) -> dict[str, str]:
    """File name -> text, beside compose.yaml on the router host (the key's file only with a
    key, router.tls's pair with TLS: PRIVATE_FILES ships them 0600)."""
    out = {PROXY_CONF_FILE: proxy_conf_text(inv)}
    if inv.secrets.api_key is not None and api_key:
        out[PROXY_AUTH_FILE] = proxy_auth_text(api_key)
    if inv.router.tls is not None and tls is not None:
        out[PROXY_TLS_CERT], out[PROXY_TLS_KEY] = tls
    return out


def proxy_service(inv: Inventory, project: str, labels: tuple[tuple[str, str], ...]) -> Service:
    """The proxy's container: host networking, the shipped nginx.conf read-only; its config
    hash covers the conf's text (a label), so a changed conf recreates it."""
    r = inv.router
    project_dir = f"{inv.remote_dir.rstrip('/')}/{inv.name}"
    conf = proxy_conf_text(inv)
    mounts = [BindMount(f"{project_dir}/{PROXY_CONF_FILE}", PROXY_CONF_IN_CONTAINER, True)]
    if inv.secrets.api_key is not None:
        mounts.append(BindMount(f"{project_dir}/{PROXY_AUTH_FILE}", PROXY_AUTH_IN_CONTAINER, True))
    if r.tls is not None:
        mounts.append(BindMount(f"{project_dir}/{PROXY_TLS_CERT}", PROXY_CERT_IN_CONTAINER, True))
        mounts.append(BindMount(f"{project_dir}/{PROXY_TLS_KEY}", PROXY_KEY_IN_CONTAINER, True))
    digest = hashlib.sha256(conf.encode()).hexdigest()[:16]
    return Service(
        name="proxy",
        role="proxy",
        host=r.host,
        address=advertised_address(inv.hosts[r.host]),
        port=r.port,
        project=project,
        image=r.proxy_image,
        command=("-c", PROXY_CONF_IN_CONTAINER),
        entrypoint=("nginx",),
        environment=(),
        gpus=None,
        rdma=False,
        restart=inv.container.restart,
        labels=(*labels, ("io.pdboot.proxy-conf", digest)),
        mounts=tuple(mounts),
        cap_drop=(ALL,),  # and back only what nginx's master uses (plan/privileges.py)
        cap_add=proxy_caps(r.port),
        scheme="https" if r.tls is not None else "http",
    )
