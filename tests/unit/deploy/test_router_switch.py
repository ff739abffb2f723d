"""switch_router: the degraded switch carried out on a router (plan/degraded.py decides), with
a fake router that checks, after every call, that the list still routes as vllm-router 0.1.17
does (tests/testbed/standin/test_degraded_router.py runs the real one)."""

from __future__ import annotations

import threading

from pdboot.deploy.router_api import switch_router
from pdboot.inventory.schema import TierName
from pdboot.plan.degraded import PLAIN, RouteChange, routed_workers

P, D = "http://p:8200", "http://d:8201"


class Router:
    def __init__(self, listed: dict[str, str]) -> None:
        self.listed = dict(listed)
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def add(self, url: str, worker_type: str) -> None:
        with self.lock:
            self.calls.append(("add", url))
            self.listed[url] = worker_type

    def remove(self, url: str) -> bool:
        with self.lock:
            self.calls.append(("remove", url))
            return self.listed.pop(url, None) is not None


def test_into_degraded_and_back_ends_on_the_wanted_lists() -> None:
    pd: dict[str, TierName] = {P: "prefill", D: "decode"}
    router = Router(routed_workers(pd))
    done, mode = switch_router(router, router.listed, {D: "decode"})
    assert mode == "decode_only"
    assert router.listed == {D + "/.": PLAIN}
    assert done[0] == RouteChange("add", D + "/.", PLAIN)  # the plain entry first
    switch_router(router, router.listed, pd)
    assert router.listed == {P: "prefill", D: "decode"}
    assert router.calls[-1] == ("remove", D + "/.")  # the plain entry last


def test_an_engine_that_cannot_be_registered_counts_as_out_until_it_can() -> None:
    """A prefill readmitted but failing /health at the switch: the decode keeps serving
    plain (a decode entry without the prefill would answer 503)."""
    router = Router({D + "/.": PLAIN})
    pd: dict[str, TierName] = {P: "prefill", D: "decode"}
    done, mode = switch_router(router, router.listed, pd, lambda u: u != P)
    assert (done, mode, router.listed) == ([], "decode_only", {D + "/.": PLAIN})
    done, mode = switch_router(router, router.listed, pd)
    assert mode == "pd" and router.listed == {P: "prefill", D: "decode"}


def test_a_registered_engine_failing_health_is_not_removed_for_it() -> None:
    """Evicting is the policy's decision (plan/watch/policy.py), not the switch's."""
    router = Router({P: "prefill", D: "decode"})
    pd: dict[str, TierName] = {P: "prefill", D: "decode"}
    assert switch_router(router, router.listed, pd, lambda _u: False) == ([], "pd")
