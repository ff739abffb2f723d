"""`status` of the standby ingress (deploy/ingress_status.py): the address parser walked over
real `ip -o -4 addr show` captures (tests/unit/fixtures/vrrp/README.md says what each holds),
and the lines status prints for each state."""

from __future__ import annotations

import pytest

from pdboot.deploy.ingress_status import IngressState, holds_address
from pdboot.deploy.router_api import WorkerDiff
from pdboot.plan.build import build_plan
from tests.unit.builders import STANDBY_HOSTS, STANDBY_PAIR, inventory
from tests.unit.paths import FIXTURES

VRRP = FIXTURES / "vrrp"
HOSTS = STANDBY_HOSTS
PAIR = STANDBY_PAIR


@pytest.mark.parametrize(
    ("capture", "address", "held"),
    [
        ("ip-addr-holder.txt", "10.77.9.240", True),
        ("ip-addr-holder.txt", "10.77.9.24", False),  # a prefix of it is not it
        ("ip-addr-holder.txt", "10.77.9.2", False),
        ("ip-addr-holder.txt", "10.77.9.12", True),  # the host's own, listed as well
        ("ip-addr-backup.txt", "10.77.9.240", False),
        ("ip-addr-backup.txt", "10.77.9.12", True),
    ],
)
def test_the_address_in_real_captures(capture: str, address: str, held: bool) -> None:
    assert holds_address((VRRP / capture).read_text(), address) is held


def test_one_holder_and_a_standby_in_step_is_ok() -> None:
    p = build_plan(inventory(hosts=HOSTS, overrides=PAIR))
    state = IngressState(("s",), (), WorkerDiff())
    assert state.ok
    assert state.lines(p) == [
        ("virtual IP 192.0.2.100: held by s (standby)", "info"),
        ("standby router@s: in step (every engine registered)", "info"),
    ]


def test_both_holders_or_none_is_said() -> None:
    p = build_plan(inventory(hosts=HOSTS, overrides=PAIR))
    both = IngressState(("r", "s"), (), WorkerDiff())
    assert not both.ok
    assert ("virtual IP 192.0.2.100: held by r and s at once (split LAN?)", "warn") in both.lines(p)
    none = IngressState((), (), WorkerDiff())
    assert ("virtual IP 192.0.2.100: held by no ingress host", "warn") in none.lines(p)


def test_a_standby_out_of_step_fails_status() -> None:
    p = build_plan(inventory(hosts=HOSTS, overrides=PAIR))
    state = IngressState(("r",), (), WorkerDiff(foreign=(), missing=("http://192.0.2.10:8200",)))
    assert not state.ok
    assert (
        "standby router@s: out of step: missing http://192.0.2.10:8200",
        "warn",
    ) in state.lines(p)
    unread = IngressState(("r",), (), WorkerDiff(error="GET /workers: refused"))
    assert not unread.ok and "workers not read" in unread.lines(p)[-1][0]


def test_no_standby_no_lines() -> None:
    p = build_plan(inventory(hosts=HOSTS))
    assert IngressState().lines(p) == [] and IngressState().ok
