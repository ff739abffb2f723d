"""`pdboot watch`'s alerts about the standby ingress (docs/ingress-standby.md), pure: from what
one round saw (the ingress hosts holding the virtual IP, what bringing the standby router's
workers back to the router host's list changed, or why it could not), the alerts to raise.

"address moved": the virtual IP is held by another host than in the last round that saw one
holder (a failover, or a failback). "standby out of step": the standby router's workers
differed from the router host's (watch made them equal: an eviction or re-admission the
standby missed, a standby router restarted empty), or could not be read or changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ADDRESS_MOVED = "address_moved"
STANDBY_OUT_OF_STEP = "standby_out_of_step"


@dataclass(frozen=True)
class IngressRound:
    holders: tuple[str, ...]  # ingress hosts holding the virtual IP this round
    changes: tuple[str, ...] = ()  # what the standby's list needed ("register decode http://...")
    error: str = ""  # the standby's (or the router host's) list could not be read or changed


def ingress_alerts(
    before: str, seen: IngressRound, virtual_ip: str
) -> tuple[str, list[tuple[str, str]]]:
    """(the holder to remember, [(fault, reason)]); ``before``: the holder remembered ("":
    none yet)."""
    alerts: list[tuple[str, str]] = []
    holder = before
    if len(seen.holders) == 1:
        holder = seen.holders[0]
        if before and holder != before:
            alerts.append((ADDRESS_MOVED, f"{virtual_ip} moved from {before} to {holder}"))
    elif len(seen.holders) > 1:
        both = " and ".join(seen.holders)
        alerts.append((ADDRESS_MOVED, f"{virtual_ip} held by {both} at once (split LAN?)"))
    if seen.error:
        alerts.append((STANDBY_OUT_OF_STEP, f"standby router: {seen.error}"))
    elif seen.changes:
        alerts.append((STANDBY_OUT_OF_STEP, f"{_listed(seen.changes)} (brought back in step)"))
    return holder, alerts


def _listed(changes: Sequence[str]) -> str:
    shown = "; ".join(changes[:4])
    more = f" and {len(changes) - 4} more" if len(changes) > 4 else ""
    return f"the standby router needed: {shown}{more}"
