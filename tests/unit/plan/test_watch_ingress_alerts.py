"""`pdboot watch`'s standby ingress alerts (plan/watch/ingress.py): "address moved" when the
holder changes between rounds, "standby out of step" when its list needed changes or could
not be read."""

from __future__ import annotations

from pdboot.plan.watch.ingress import (
    ADDRESS_MOVED,
    STANDBY_OUT_OF_STEP,
    IngressRound,
    ingress_alerts,
)

VIP = "10.0.0.100/24"


def test_the_first_holder_is_remembered_without_an_alert() -> None:
    assert ingress_alerts("", IngressRound(("a",)), VIP) == ("a", [])


def test_a_move_alerts_once_and_is_remembered() -> None:
    holder, alerts = ingress_alerts("a", IngressRound(("b",)), VIP)
    assert holder == "b"
    assert alerts == [(ADDRESS_MOVED, "10.0.0.100/24 moved from a to b")]
    assert ingress_alerts(holder, IngressRound(("b",)), VIP) == ("b", [])


def test_no_holder_keeps_the_last_one_and_two_holders_alert() -> None:
    # a round in mid-failover (nobody holds it yet) does not forget who held it
    assert ingress_alerts("a", IngressRound(()), VIP) == ("a", [])
    holder, alerts = ingress_alerts("a", IngressRound(("a", "b")), VIP)
    assert holder == "a" and alerts[0][0] == ADDRESS_MOVED and "a and b" in alerts[0][1]


def test_the_standby_out_of_step() -> None:
    changes = ("deregister decode http://10.0.0.2:8201",)
    _, alerts = ingress_alerts("a", IngressRound(("a",), changes), VIP)
    assert alerts == [
        (
            STANDBY_OUT_OF_STEP,
            "the standby router needed: deregister decode http://10.0.0.2:8201 "
            "(brought back in step)",
        )
    ]
    _, alerts = ingress_alerts("a", IngressRound(("a",), (), "GET /workers: refused"), VIP)
    assert alerts == [(STANDBY_OUT_OF_STEP, "standby router: GET /workers: refused")]
    many = tuple(f"register decode http://10.0.0.{i}:8201" for i in range(6))
    _, alerts = ingress_alerts("a", IngressRound(("a",), many), VIP)
    assert alerts[0][1].endswith("and 2 more (brought back in step)")
