"""The fuzzer's part for the sections added after it was written (issue 32, item F): the
`watch:` and `weights:` sections and the front door's router keys (the proxy's image, the
router's loopback port, the body limit, TLS references, watch.bind), generated at random onto
a base, their refused classes
(each must be refused with file:line), and the oracles an accepted inventory must pass,
written from the docs (docs/watch.md, the weights section of the README) and the plan, not
from pdboot's validators. Imported by scripts/fuzz_inventory.py."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

Data = dict[str, Any]
Mutator = Callable[[Data, random.Random], bool]

_ENDPOINT = re.compile(r"https?://[A-Za-z0-9.:\[\]_-]+(/\S*)?", re.ASCII)


def add_sections(d: Data, r: random.Random) -> None:
    """A valid-looking watch and/or weights section (each half the time), so the random
    changes that follow reach their keys too."""
    if r.random() < 0.5:
        w: Data = {"interval_seconds": r.choice([0.5, 5, 30, 600]),
                   "evict_after": r.randint(1, 5), "readmit_after": r.randint(1, 5)}  # fmt: skip
        if r.random() < 0.6:
            w["image"] = r.choice(["reg.example:5000/pdboot/watch:1", "pdboot-watch:0.9"])
        if r.random() < 0.7:
            w["port"] = r.choice([29100, 29200, 18000, 61000])
        d["watch"] = w
    if r.random() < 0.5:
        wt: Data = {"stage": r.random() < 0.8}
        if r.random() < 0.5:
            wt["seed"] = "first_host"
            wt["seed_port"] = r.choice([8765, 18765, 40000])
        if r.random() < 0.3:
            wt["endpoint"] = r.choice(["https://hub.example", "http://10.0.0.5:8080/mirror"])
        d["weights"] = wt
    router = d.get("router")
    if isinstance(router, dict) and r.random() < 0.5:  # the front door (issue 28)
        if r.random() < 0.5:
            router["internal_port"] = r.choice([8081, 18081, 9000, 40001])
        if r.random() < 0.5:
            router["proxy_image"] = r.choice(["reg.example:5000/nginx:1.27.3", "nginx:1.27.3"])
        if r.random() < 0.5:
            router["max_request_mb"] = r.choice([1, 32, 512])
        if r.random() < 0.3:
            router["tls"] = {"cert": "file:/etc/pdboot/ep.pem", "key": "env:PDBOOT_EP_KEY"}
        if r.random() < 0.3 and isinstance(d.get("watch"), dict):
            d["watch"]["bind"] = r.choice(["10.0.0.5", "::1", "192.0.2.10"])


def _internal_clash(d: Data, r: random.Random) -> bool:
    """The router's loopback port on a port the router host already serves (its public
    port, its metrics): the proxy and the router would fight over it."""
    router = _router(d)
    if not router:
        return False
    router["internal_port"] = r.choice(
        [router.get("port", 8000), router.get("metrics_port", 29000)]
    )
    return True


def _router(d: Data) -> Data:
    r = d.get("router")
    return r if isinstance(r, dict) else {}


def _watch_clash(d: Data, r: random.Random) -> bool:
    """watch.port on a port the router host already listens on."""
    router = _router(d)
    port = r.choice([router.get("port", 8000), router.get("metrics_port", 29000)])
    if not isinstance(port, int):
        return False
    d["watch"] = {"image": "reg.example/pdboot/watch:1", "port": port}
    return True


def _engine_hosts(d: Data) -> list[Any]:
    hosts: list[Any] = []
    for t in ("prefill", "decode"):
        tier = d.get(t)
        if isinstance(tier, dict) and isinstance(tier.get("hosts"), list):
            hosts += tier["hosts"]
    return list(dict.fromkeys(h for h in hosts if isinstance(h, str)))


def _seed_clash(d: Data, r: random.Random) -> bool:
    """weights.seed_port on the first engine host's engine port (it serves the others while
    engines of the previous roll still run there)."""
    hosts = _engine_hosts(d)
    if len(hosts) < 2:
        return False
    first = hosts[0]
    tname = next(t for t in ("prefill", "decode") if first in (d.get(t) or {}).get("hosts", []))
    port = d[tname].get("port", 8200 if tname == "prefill" else 8201)
    if not isinstance(port, int) or port < 1024:
        return False
    d["weights"] = {"stage": True, "seed": "first_host", "seed_port": port}
    return True


def _nested(keys: tuple[str, str], values: list[Any]) -> Mutator:
    def m(d: Data, r: random.Random) -> bool:
        section = d.setdefault(keys[0], {})
        if not isinstance(section, dict):
            return False
        section[keys[1]] = r.choice(values)
        if keys[0] == "weights" and keys[1] == "seed_port":
            section.update(stage=True, seed="first_host")
        return True

    return m


INVALID: list[tuple[str, Mutator]] = [
    ("watch port clash", _watch_clash),
    ("seed port clash", _seed_clash),
    ("invalid watch image", _nested(("watch", "image"), ["Bad/Img:1", "a b", "-x", "x;id"])),
    ("weights endpoint", _nested(("weights", "endpoint"),
                                 ["ftp://x", "http://a b", "javascript:x", "https://"])),
    ("privileged seed port", _nested(("weights", "seed_port"), [80, 0, 1023])),
    ("watch interval", _nested(("watch", "interval_seconds"), [0, -1, 0.1])),
    ("router internal port clash", _internal_clash),
    ("invalid proxy image", _nested(("router", "proxy_image"), ["Bad/Img:1", "a b", "-x", "x;id"])),
    ("request body limit", _nested(("router", "max_request_mb"), [0, -1, 5000])),
    ("TLS value, not a reference", _nested(("router", "tls"),
                                           [{"cert": "-----BEGIN CERT", "key": "file:/k"},
                                            {"cert": "file:/c"}])),
    ("watch bind", _nested(("watch", "bind"), ["not-an-ip", "0.0.0.0 ; id", ""])),
]  # fmt: skip


def invariants(inv: Any, plan: Any, reference: re.Pattern[str]) -> list[str]:
    """What must hold of the new sections in any accepted inventory (``reference``: the
    fuzzer's image reference grammar, distribution/reference's)."""
    bad: list[str] = []
    w = inv.watch
    if w is not None:
        if w.image is not None and not reference.fullmatch(w.image):
            bad.append(f"watch.image {w.image!r} accepted")
        if w.interval_seconds < 0.5:
            bad.append(f"watch.interval_seconds {w.interval_seconds} accepted")
    wt = inv.weights
    if wt.endpoint is not None and not _ENDPOINT.fullmatch(wt.endpoint):
        bad.append(f"weights.endpoint {wt.endpoint!r} accepted")
    if wt.seed_port < 1024:
        bad.append(f"weights.seed_port {wt.seed_port} accepted")
    r = inv.router
    if not reference.fullmatch(r.proxy_image):
        bad.append(f"router.proxy_image {r.proxy_image!r} accepted")
    if not 1 <= r.max_request_mb <= 4096:
        bad.append(f"router.max_request_mb {r.max_request_mb} accepted")
    if r.internal_port in (r.port, r.metrics_port):
        bad.append(f"router.internal_port {r.internal_port} on the router's own port accepted")
    if r.tls is not None and not all(
        v.startswith(("env:", "file:", "/", "~", "./")) for v in (r.tls.cert, r.tls.key)
    ):
        bad.append("router.tls holding a value, not a reference, accepted")
    return bad + listener_clashes(inv, plan)


def listener_clashes(inv: Any, plan: Any) -> list[str]:
    """Two listeners on one port of a host, from what the plan starts (each service's HTTP
    port, side channel base and metrics port; the watch service is a plan service) and the
    weights seed on the first engine host."""
    taken: dict[str, dict[int, str]] = {}
    bad: list[str] = []

    def claim(host: str, port: int | None, what: str) -> None:
        if port is None:
            return
        mine = taken.setdefault(host, {})
        if port in mine:
            bad.append(f"port {port} on {host}: {mine[port]} and {what} accepted")
        mine[port] = what

    for host, hp in plan.hosts.items():
        for s in hp.services:
            if s.dp_role != "follower":  # a headless rank serves no HTTP
                claim(host, s.port, f"{s.name} HTTP")
            claim(host, s.side_channel_port, f"{s.name} side channel")
            claim(host, s.metrics_port, f"{s.name} metrics")
    hosts = list(dict.fromkeys(inv.prefill.hosts + inv.decode.hosts))
    wt = inv.weights
    if wt.stage and wt.seed == "first_host" and len(hosts) > 1:
        claim(hosts[0], wt.seed_port, "weights seed")
    return bad


def bypasses(inv: Any) -> list[dict[str, Any]]:
    """Updates that bypass pdboot's validators (model_copy does not validate), each of
    which the invariants above must catch: else 0 escapes would prove nothing."""
    from pdboot.inventory.watch_schema import Watch

    router = inv.router
    return [
        {
            "watch": Watch.model_construct(
                image="reg.example/w:1", port=router.port, interval_seconds=30.0
            )
        },
        {"watch": Watch.model_construct(image="Bad/Img", port=61000, interval_seconds=30.0)},
        {"weights": inv.weights.model_copy(update={"endpoint": "ftp://x"})},
        {"router": router.model_copy(update={"proxy_image": "Bad/Img"})},
        {"router": router.model_copy(update={"internal_port": router.port})},
    ]
