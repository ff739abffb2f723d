"""Degraded mode: when one tier has no engine in rotation, the endpoint serves from the other
tier alone, as plain engines, and goes back to P/D when the tier is back (issue 43).

Why it works: a vLLM engine with the NixlConnector (kv_producer or kv_consumer) treats a
request without ``kv_transfer_params`` as a plain request and computes the prompt itself.

Where the switch lives: the router's worker list, nothing else. vllm-router 0.1.17 in
``--enable-igw`` mode routes a model two-stage (P/D) while it has any ``prefill`` or
``decode`` worker for it, and otherwise to its ``regular`` workers (tried with the real router
and stand-in engines, tests/testbed/standin/test_degraded_router.py: decode workers alone, or
beside regular ones, answer 503 "No available workers: 0 prefill, 1 decode"; regular workers
alone serve). So degraded mode registers each serving engine as a ``regular`` worker under
its *plain URL*, the engine's URL followed by ``/.``: the router files it apart from the
engine's P/D entry, and the request URL it builds (``http://H:P/./v1/...``) loses the dot
segment when parsed, so the engine gets ``/v1/...`` unchanged. (A trailing slash alone, as
first tried, makes the router send ``//v1/...``, which real vLLM answers 404 ``{"detail":
"Not Found"}``: seen on the real-engine testbed; Python's http.server, under the stand-in,
folds the double slash away, so only real vLLM showed it.) Every P/D entry is removed;
P/D comes back by registering the tiers again and removing the plain entries.

Why there and not elsewhere: the watch service runs beside the router with nothing but the
router's loopback worker API (no Docker, no SSH: plan/watch/sidecar.py), so a switch it can
make lives in that list. The proxy stays as it is (its route file belongs to the router swap,
and pointing it at one decode would not balance several), no second router runs, and a
standby router gets the same list from the same function (``routed_workers``; carried out by
deploy/router_api.py's ``switch_router``).

What the router cannot do is change two entries at once: between the P/D entries going (or
coming) one by one, the router answers 503 for lack of a complete pair. ``switch_steps``
orders the calls so that this can happen in one place only, a batch of P/D entries the caller
sends together (measured on loopback: the window is about a millisecond; 2 of 347 requests
from 4 clients back to back failed over 80 switches, against 5 of 358 sending them one by one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pdboot.inventory.schema import TierName

# pd: both tiers serve; decode_only / prefill_only: degraded, that tier alone serves plain;
# down: no engine in rotation at all
ServingMode = Literal["pd", "decode_only", "prefill_only", "down"]
PLAIN = "regular"  # the router's worker type for a plain engine


PLAIN_SUFFIX = "/."  # the module docstring says why a dot segment, not a bare slash


def plain_url(url: str) -> str:
    """The URL an engine is registered under as a plain (regular) worker."""
    return engine_url(url) + PLAIN_SUFFIX


def is_plain_url(url: str) -> bool:
    return url.endswith(PLAIN_SUFFIX)


def engine_url(url: str) -> str:
    """The engine a router entry (plain or not) stands for."""
    return url.rstrip("/").removesuffix(PLAIN_SUFFIX).rstrip("/")


def serving_mode(in_rotation: Mapping[str, TierName]) -> ServingMode:
    """``in_rotation``: engine URL -> tier, for the engines watch keeps in the router."""
    tiers = set(in_rotation.values())
    if {"prefill", "decode"} <= tiers:
        return "pd"
    if "decode" in tiers:
        return "decode_only"
    if "prefill" in tiers:
        return "prefill_only"
    return "down"


def routed_workers(in_rotation: Mapping[str, TierName]) -> dict[str, str]:
    """Router entry URL -> worker type that serves the engines in rotation: in P/D every
    engine as its tier; degraded, the serving tier's engines as plain workers only (a P/D
    entry beside them would switch P/D routing on: 503)."""
    mode = serving_mode(in_rotation)
    if mode == "pd":
        return {engine_url(u): t for u, t in sorted(in_rotation.items())}
    return {plain_url(u): PLAIN for u in sorted(in_rotation)}


@dataclass(frozen=True)
class RouteChange:
    """One call of the router's worker API (deploy/router_api.py carries it out)."""

    action: Literal["add", "remove"]
    url: str
    worker_type: str

    def describe(self) -> str:
        verb = "register" if self.action == "add" else "deregister"
        return f"{verb} {self.worker_type} {self.url}"


def switch_steps(
    present: Mapping[str, str], wanted: Mapping[str, str]
) -> list[tuple[RouteChange, ...]]:
    """The router calls that turn ``present`` (entry URL -> type) into ``wanted``, in steps;
    the calls of one step are sent together. First the plain entries that come, then the P/D
    entries that come and go (one step: the router routes a model P/D as soon as it has one
    P/D entry, and only a complete pair serves), then the plain entries that go. An entry of
    the wrong type is removed before it is added again (the router files one per URL)."""
    adds = {u: t for u, t in wanted.items() if present.get(u) != t}
    removes = {u: t for u, t in present.items() if wanted.get(u) != t}
    retyped = set(adds) & set(removes)

    def calls(
        action: Literal["add", "remove"], items: dict[str, str], plain: bool
    ) -> list[RouteChange]:
        return [
            RouteChange(action, u, t)
            for u, t in sorted(items.items())
            if (t == PLAIN) == plain and u not in retyped
        ]

    steps = [
        tuple(calls("add", adds, True)),
        tuple(calls("remove", removes, False) + calls("add", adds, False)),
        tuple(calls("remove", removes, True)),
        tuple(RouteChange("remove", u, removes[u]) for u in sorted(retyped)),
        tuple(RouteChange("add", u, adds[u]) for u in sorted(retyped)),
    ]
    return [s for s in steps if s]


def lost_tier(mode: ServingMode) -> TierName | None:
    """The tier that has no engine in rotation while degraded."""
    if mode == "decode_only":
        return "prefill"
    if mode == "prefill_only":
        return "decode"
    return None


def describe(mode: str) -> str:
    """A serving mode in words (events carry it as text)."""
    return {
        "pd": "P/D (prefill and decode tiers)",
        "decode_only": "degraded: the decode tier alone, plain (no prefill in rotation)",
        "prefill_only": "degraded: the prefill tier alone, plain (no decode in rotation)",
        "down": "down: no engine in rotation",
    }.get(mode, mode)


def plain_urls(urls: Sequence[str]) -> set[str]:
    """The plain entries pdboot may register for these engines (not foreign workers)."""
    return {plain_url(u) for u in urls}
