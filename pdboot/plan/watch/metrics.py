"""`pdboot watch`'s own Prometheus metrics: the table of what it exports and the text exposition.

Pure apart from a lock: the loop records, the HTTP thread renders. ``WATCH_METRICS`` is the one
list of names: the exposition writes only these, and the test of the shipped dashboard and alert
rules checks every ``pdboot_watch_*`` name they use against it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

# (name, type, help, label names)
WATCH_METRICS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "pdboot_watch_canary_ok",
        "gauge",
        "1 when the pair's latest canary was good (same answer as the decode alone, KV pulled, "
        "no failed transfers), else 0.",
        ("prefill", "decode"),
    ),
    (
        "pdboot_watch_canaries_total",
        "counter",
        "Canaries sent through the pair, by result (ok or the fault kind).",
        ("prefill", "decode", "result"),
    ),
    (
        "pdboot_watch_canary_seconds",
        "gauge",
        "Seconds the pair's latest canary took on the P/D path (prefill step + decode step).",
        ("prefill", "decode"),
    ),
    (
        "pdboot_watch_seconds_since_good_canary",
        "gauge",
        "Seconds since the pair's latest good canary (since watch started when none yet).",
        ("prefill", "decode"),
    ),
    (
        "pdboot_watch_engine_in_rotation",
        "gauge",
        "1 while the engine is in the router's rotation as far as watch decided, else 0.",
        ("engine", "tier"),
    ),
    (
        "pdboot_watch_evictions_total",
        "counter",
        "Engines watch removed from the router, by fault kind.",
        ("engine", "tier", "fault"),
    ),
    (
        "pdboot_watch_readmissions_total",
        "counter",
        "Engines watch put back into the router after consecutive good canaries.",
        ("engine", "tier"),
    ),
    ("pdboot_watch_restarts_total", "counter", "Engines watch restarted.", ("engine", "tier")),
    (
        "pdboot_watch_alerts_total",
        "counter",
        "Faults watch could not act on (the last engine of a tier, a router or restart error).",
        ("engine", "tier", "fault"),
    ),
    (
        "pdboot_watch_foreign_workers_removed_total",
        "counter",
        "Workers in the router's list that pdboot did not register (not an engine of the "
        "inventory), removed by watch.",
        ("url", "worker_type"),
    ),
    (
        "pdboot_watch_workers_reregistered_total",
        "counter",
        "Healthy engines in rotation missing from the router's list (a router that came back "
        "empty), registered again by watch.",
        ("engine", "tier"),
    ),
    (
        "pdboot_watch_degraded",
        "gauge",
        "1 while the endpoint serves from one tier alone as plain engines (a tier has no "
        "engine in rotation: degraded mode), 0 while it serves P/D.",
        (),
    ),
    (
        "pdboot_watch_serving_switches_total",
        "counter",
        "Switches of how the endpoint serves, by the mode switched to (pd, decode_only, "
        "prefill_only, down).",
        ("mode",),
    ),
    (
        "pdboot_watch_held_back",
        "gauge",
        "1 while an `up` or `down` holds the deployment lock and watch only reads /health "
        "(no canaries, no restarts, no changes to the router's workers), else 0.",
        (),
    ),
    ("pdboot_watch_rounds_total", "counter", "Rounds of canaries completed.", ()),
    (
        "pdboot_watch_last_round_timestamp_seconds",
        "gauge",
        "Unix time of the latest completed round.",
        (),
    ),
)
_TYPES = {name: kind for name, kind, _, _ in WATCH_METRICS}
_LABELS = {name: labels for name, _, _, labels in WATCH_METRICS}

Key = tuple[str, tuple[str, ...]]


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class WatchMetrics:
    def __post_init__(self) -> None:
        self._values: dict[Key, float] = {}
        self._lock = threading.Lock()

    def _key(self, name: str, labels: tuple[str, ...]) -> Key:
        if name not in _TYPES or len(labels) != len(_LABELS[name]):
            raise ValueError(f"{name}{labels}: not one of WATCH_METRICS")
        return name, labels

    def set(self, name: str, value: float, *labels: str) -> None:
        with self._lock:
            self._values[self._key(name, labels)] = value

    def inc(self, name: str, *labels: str, by: float = 1.0) -> None:
        key = self._key(name, labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + by

    def value(self, name: str, *labels: str) -> float | None:
        with self._lock:
            return self._values.get((name, labels))

    def exposition(self) -> str:
        """Prometheus text format 0.0.4."""
        with self._lock:
            values = dict(self._values)
        out: list[str] = []
        for name, kind, doc, label_names in WATCH_METRICS:
            out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
            for (n, labels), v in sorted(values.items()):
                if n != name:
                    continue
                lab = ",".join(
                    f'{k}="{_escape(x)}"' for k, x in zip(label_names, labels, strict=True)
                )
                out.append(f"{name}{{{lab}}} {v}" if lab else f"{name} {v}")
        return "\n".join(out) + "\n"
