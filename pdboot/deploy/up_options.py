"""`up`'s options and what it runs with (clock, HTTP, secrets, the weights staged), and the
exception a failed step ends it with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdboot.deploy.waits import Clock
from pdboot.deploy.weights.staging import NOTHING_STAGED, Staging
from pdboot.transport.http import HttpFn

# asked with the outages in words before a tier that cannot roll goes down; True: go on
Confirm = Callable[[list[str]], bool]


class UpStopped(Exception):
    """A step failed and was reported; `up` exits 1."""


@dataclass(frozen=True)
class UpOptions:
    skip_preflight: bool = False
    rollback: bool = False
    accept_new_host_keys: bool = False
    speed: bool = True  # the long request that measures the KV path per pair (after prove)
    prove: bool = True
    no_wait: bool = False  # a held deployment lock: exit 1 at once instead of waiting
    rolling: bool = True  # False (--no-rolling): the recreate path, every change at once
    plan_only: bool = False  # --plan: print the steps, change nothing
    detailed_exitcode: bool = False  # with --plan: exit 2 when there are changes (terraform's)
    yes: bool = False  # --yes: accept the outage of a tier that cannot roll
    refresh_weights: bool = False  # move to the commit model_revision names now (plan/weights/)


@dataclass(frozen=True)
class UpEnv:
    clock: Clock
    fetch: HttpFn
    token: dict[str, str] | None
    confirm: Confirm | None = None
    weights: Staging = NOTHING_STAGED  # the commit the engines load, staged during the pull
    tls: tuple[str, str] | None = None  # router.tls's (cert, key) PEM, read at `up`
