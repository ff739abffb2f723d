"""``router.proxy_limits``: what the public endpoint's proxy (nginx, plan/proxy.py) allows one
client, with defaults a full-speed benchmark never reaches (docs/security.md, "Limits")."""

from __future__ import annotations

from pydantic import Field

from pdboot.inventory.strict import Strict


class ProxyLimits(Strict):
    # Per client address (nginx limit_conn / limit_req over the peer's address; behind a load
    # balancer every client shares its address: raise them there). Over a limit: 429.
    # requests being served at once, streams included (`pdboot bench` sweeps 1,4,16 by default)
    connections_per_client: int = Field(default=1024, ge=1, le=100000)
    # the sustained rate of requests forwarded to the router ...
    requests_per_second_per_client: int = Field(default=1000, ge=1, le=1000000)
    # ... and how many more it may send at once above that rate, served without delay
    request_burst_per_client: int = Field(default=2000, ge=0, le=1000000)
    # the largest body of GET /health and GET /v1/models, in KiB (the completions paths take
    # router.max_request_mb)
    small_body_kb: int = Field(default=16, ge=1, le=1024)
    # the whole request line and headers must arrive within this (nginx client_header_timeout,
    # counted from the first byte: a client sending a byte every few seconds is closed) ...
    header_timeout_secs: int = Field(default=10, ge=1, le=3600)
    # ... and each read of a body may wait this long (client_body_timeout, between reads); a
    # refused request's body is read and dropped for at most 30 s (lingering_time)
    body_timeout_secs: int = Field(default=30, ge=1, le=3600)
