"""The views: JSON lines (one object per event, typed, timestamped, progress throttled) and
the terminal view's text in a log (what operators and the e2e tests read)."""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone

from rich.console import Console

from pdboot import events as ev
from pdboot.views.jsonl import JsonLinesView, to_json
from pdboot.views.terminal import TerminalView

WAIT = ev.WaitTick(
    6.0, (ev.ServiceWait("decode@d1", "waiting", "connection refused", "\x1b[32mINFO\x1b[0m load"),)
)
STREAM: list[ev.Event] = [
    ev.PreflightDone(ok=True, skipped=True),
    ev.StageStarted("pull", ("d1: reg:5000/vllm/vllm-openai:v0.33.0",)),
    ev.PullProgress("d1", "reg:5000/vllm/vllm-openai:v0.33.0", 10, 100, "downloading"),
    ev.PullDone(
        "d1", "reg:5000/vllm/vllm-openai:v0.33.0", True, "sha256:" + "ab" * 32, 2_000_000, 1.5
    ),
    ev.ServiceAction("decode@d1", "create", "not running"),
    ev.StageStarted("wait", ("decode@d1",)),
    WAIT,
    ev.ServiceReady("decode@d1", 7.5),
    ev.TierReady(("decode", "prefill"), "/health 200", 7.5),
    ev.HostErrors("pull failed on", (("p1", "no such image or tag"),)),
    ev.KVVerdict(True, True, "decode pulled the KV cache from a prefill engine", "Hi there"),
    ev.Done("up", 0, 9.0, "deployed in 9.0s"),
]


def test_every_event_is_one_json_object_with_its_type_and_time() -> None:
    buf = io.StringIO()
    ticks = iter([0.0, 0.1, 0.2, 5.0])
    view = JsonLinesView(buf, monotonic=lambda: next(ticks))
    for e in STREAM:
        view(e)
    view(ev.PullProgress("d1", "reg:5000/vllm/vllm-openai:v0.33.0", 20, 100, "downloading"))
    docs = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert len(docs) == len(STREAM)  # the second progress event within a second is dropped
    assert [d["event"] for d in docs][:4] == ["preflight", "stage", "pull_progress", "pull_done"]
    assert all(datetime.fromisoformat(d["ts"]).tzinfo is not None for d in docs)
    tick = next(d for d in docs if d["event"] == "waiting")
    assert tick["services"][0] == {
        "service": "decode@d1",
        "state": "waiting",
        "detail": "connection refused",
        "log_line": "\x1b[32mINFO\x1b[0m load",
        "phase": "",
        "done": None,
        "total": None,
    }
    assert docs[-1] == {**docs[-1], "event": "done", "exit_code": 0, "command": "up"}
    assert next(d for d in docs if d["event"] == "host_errors")["errors"] == [
        ["p1", "no such image or tag"]
    ]


def test_to_json_is_stable() -> None:
    t = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
    assert json.loads(to_json(ev.ServiceReady("router@r", 1.25), t)) == {
        "format_version": "1.0",
        "event": "ready",
        "ts": "2026-01-02T03:04:05.678+00:00",
        "service": "router@r",
        "seconds": 1.25,
    }


def test_terminal_view_in_a_log_prints_the_finished_lines() -> None:
    console = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
    view = TerminalView(console)
    for e in STREAM:
        view(e)
    view.close()
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "preflight skipped (--skip-preflight)" in text
    assert (
        "d1: reg:5000/vllm/vllm-openai:v0.33.0 pulled (2.0 MB in 1.5s, sha256:abababababab)" in text
    )
    assert "waiting decode@d1 6s: connection refused | INFO load" in text  # no ANSI codes
    assert "\nready decode@d1 after 7.5s" in text
    assert "decode+prefill tiers ready (/health 200) after 7.5s" in text
    assert "error: pull failed on p1: no such image or tag" in text
    assert "test completion: 'Hi there'" in text
    assert text.rstrip().endswith("up: deployed in 9.0s")


def test_terminal_view_on_a_terminal_runs_bars_and_live_table_through_a_real_up() -> None:
    from pdboot.deploy.up_options import UpOptions
    from tests.unit.orchestrator_fakes import World, inventory, up_in

    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system=None)
    view = TerminalView(console)
    world = World(inventory(), load={"decode": 3.0, "prefill": 2.0})
    code = up_in(world, UpOptions(skip_preflight=True), view)
    view.close()
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert code == 0
    assert "d1: vllm/vllm-openai:v0.34.0 pulled" in text
    assert "ready decode@d1 after 3.0s" in text and "ready prefill@p1 after 2.0s" in text
    assert "decode loading" in text  # the live table showed the latest log line
    assert "endpoint: http://192.0.2.12:8000/v1" in text


def test_image_check_lines_carry_the_fix_under_a_failure() -> None:
    console = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
    view = TerminalView(console)
    view(ev.StageStarted("image_check"))
    view(ev.ImageCheck("d1", "docker.image_nixl", "pass", "NIXL loads UCX", "never shown"))
    view(ev.ImageCheck("p1", "docker.image_arch", "fail", "no sm_120 kernels", "use a cu128 image"))
    view.close()
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert text.splitlines() == [
        "d1: docker.image_nixl pass: NIXL loads UCX",
        "p1: docker.image_arch fail: no sm_120 kernels",
        "  fix: use a cu128 image",
    ]
    doc = json.loads(to_json(ev.ImageCheck("p1", "docker.image_arch", "fail", "m", "f")))
    assert doc["event"] == "image_check" and doc["fix"] == "f"


def test_wait_rows_show_the_load_phase_with_a_bar_and_cut_raw_lines_at_the_end() -> None:
    from pdboot.verify.loadphase import load_phase
    from pdboot.views.terminal import progress_cell

    # vLLM 0.33's real shard progress line (tqdm through the logger)
    line = "Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01,  1.60it/s]"
    phase = load_phase([line])
    assert phase is not None and (phase.done, phase.total) == (2, 4)
    s = ev.ServiceWait("decode@d1", "waiting", "connection refused", line, phase.text(), 2, 4)
    cell = progress_cell(s)
    assert cell.plain.startswith("[#####.....] loading weights") and "2/4" in cell.plain
    raw = "(APIServer pid=1) INFO 11-30 20:01:02 [api_server.py:1971] " + "x" * 300
    cell = progress_cell(ev.ServiceWait("decode@d1", "waiting", "refused", raw))
    # the start of the line stays (it says what the line is about); rich cuts the end
    assert cell.plain.startswith("(APIServer pid=1) INFO") and cell.overflow == "ellipsis"
    assert cell.no_wrap
