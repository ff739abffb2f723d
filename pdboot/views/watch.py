"""The terminal view of `pdboot watch`: a line per round (pairs good / failing, with the
failing ones named) and a line per action; other events go to the general terminal view."""

from __future__ import annotations

from datetime import datetime, timezone

from rich.console import Console
from rich.text import Text

from pdboot.events import Emit, Event
from pdboot.plan.degraded import describe
from pdboot.plan.watch.events import (
    WatchActionTaken,
    WatchHeldBack,
    WatchRound,
    WatchServingChanged,
)


class WatchView:
    """Its lines, then every event to ``then`` (the general views)."""

    def __init__(self, out: Console, then: Emit | None = None) -> None:
        self.out, self.then = out, then

    def __call__(self, event: Event) -> None:
        if self.then is not None:
            self.then(event)
        stamp = datetime.now(timezone.utc).strftime("%H:%M:%S")
        if isinstance(event, WatchRound):
            bad = [p for p in event.pairs if p.fault]
            line = Text(
                f"{stamp} round {event.round}: {len(event.pairs) - len(bad)}/"
                f"{len(event.pairs)} pairs good ({event.seconds:.1f} s)",
                style="red" if bad else "green",
            )
            for p in bad:
                line.append(
                    f"\n  {p.prefill} -> {p.decode}: {p.fault} at {p.step or '-'}"
                    f"{': ' + p.detail if p.detail else ''}",
                    style="red",
                )
            if event.unhealthy:
                line.append(f"\n  /health failing: {', '.join(event.unhealthy)}", style="red")
            self.out.print(line, soft_wrap=True, highlight=False)
        elif isinstance(event, WatchActionTaken):
            style = "yellow" if event.ok and event.action != "alert" else "bold red"
            text = f"{stamp} {event.action} {event.engine}: {event.reason}"
            if not event.ok and event.detail:
                text += f" (not done: {event.detail})"
            self.out.print(Text(text, style=style), soft_wrap=True, highlight=False)
        elif isinstance(event, WatchHeldBack):
            if event.held:
                text = f"{stamp} not acting (round {event.rounds} held back): {event.holder}"
                if event.unhealthy:
                    text += f"; /health failing: {', '.join(event.unhealthy)}"
            else:
                text = f"{stamp} acting again: the deployment is free after {event.rounds} rounds"
            style = "yellow" if event.held else "green"
            self.out.print(Text(text, style=style), soft_wrap=True, highlight=False)
        elif isinstance(event, WatchServingChanged):
            style = "green" if event.mode == "pd" else "bold yellow"
            text = f"{stamp} serving {describe(event.mode)}"
            text += f" (was {event.before} for {event.held_seconds:.0f} s)"
            self.out.print(Text(text, style=style), soft_wrap=True, highlight=False)
