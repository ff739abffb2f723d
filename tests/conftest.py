"""Shared pytest fixtures: the multi-host testbed (tests/testbed/harness.py).

- `testbed` (session): 3 healthy hosts named decode, prefill, ingress (profile rtx6000x2,
  emulated 2x RTX PRO 6000), the registry with the engine and router images. Tests that use it
  must leave it as they found it (tb.reset() removes containers; `testbed_clean` does it
  before and after a test).
- `make_testbed` (function): a factory for fresh hosts with chosen profiles and knobs, for
  tests that break things; every testbed it made is torn down after the test.
- `cli` (session): the real pdboot command line in a subprocess (tests/cli.py); a module
  overrides it with `cli.with_(env=..., skip_preflight=True, timeout=...)`.

Outside CI a testbed test skips when this machine cannot run one (not root, not Linux,
packages missing). Under CI=true it fails instead: never a silent skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli
from tests.testbed.harness import HostSpec, Testbed, can_run

SESSION_HOSTS = (HostSpec("decode"), HostSpec("prefill"), HostSpec("ingress"))
# Two 8-GPU RTX PRO 6000 hosts with RDMA NICs (testbed/profiles.py): the module testbed of the
# e2e tests that place engines on GPUs and NICs
RTX_PAIR = (HostSpec("gpu-a", profile="rtx6000x8"), HostSpec("gpu-b", profile="rtx6000x8"))
_FIXTURES = {"testbed", "testbed_clean", "make_testbed"}


def pytest_configure(config: pytest.Config) -> None:
    """pdboot's cache on this machine (the image parser's verdicts, preflight/args_cache.py):
    one fresh directory per test process, so no test reads a verdict another run left, and
    none writes into the user's ~/.cache. A test that needs its own sets PDBOOT_CACHE_DIR."""
    os.environ["PDBOOT_CACHE_DIR"] = tempfile.mkdtemp(prefix="pdboot-test-cache-")
    # A suite started in the background of a shell without job control (`cmd &` in a script)
    # inherits SIGINT ignored, and so would every pdboot it starts: the tests that stop one
    # with Ctrl-C would then see it run on (exit 0, not 130). Children get SIGINT's default
    # back (a handler is reset on exec; an ignored signal is not).
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    made = os.environ.get("PDBOOT_CACHE_DIR")
    if made and Path(made).name.startswith("pdboot-test-cache-"):
        shutil.rmtree(made, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # a test that uses a testbed fixture is a testbed test: selectable with -m testbed
        if _FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.testbed)
        item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))


def _xdist_group(item: pytest.Item) -> str:
    """`make test` runs pytest-xdist workers with --dist loadgroup (the stand-in tests mostly
    wait on SSH, dockerd and engines: 74 % of the CPU idle in one process). A module runs whole
    on one worker, in file order (its tests share module fixtures and build on each other), and
    the real-engine package is one group: its package-scoped testbed and shared deployment are
    started once, and only one worker runs real engines on the 2 cores."""
    path = item.path.as_posix()
    if "/tests/e2e/real_engine/" in path:
        return "real_vllm"
    return item.nodeid.split("::", 1)[0]


def _require_testbed() -> None:
    why = can_run()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the testbed cannot start under CI: {why}", pytrace=False)
    pytest.skip(f"testbed unavailable: {why}")


def aiperf_for_tests() -> list[str]:
    """How tests start AIPerf: PDBOOT_AIPERF, one on PATH, or the virtualenv .ci/setup makes in
    the testbed cache. Missing: a failure under CI, else a skip."""
    from pdboot.bench.run import aiperf_command
    from tests.testbed.images import CACHE_DIR

    cmd = aiperf_command()
    if cmd is not None:
        return cmd
    venv = CACHE_DIR / f"aiperf-{AIPERF_VERSION}"
    if (venv / ".done").exists():
        return [str(venv / "bin" / "aiperf")]
    why = f"AIPerf {AIPERF_VERSION} not installed (make setup puts it in {venv})"
    if os.environ.get("CI") == "true":
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


AIPERF_VERSION = "0.13.0"  # pyproject's bench extra and .ci/setup's (a unit test checks)


@contextmanager
def started_testbed(hosts: Any, **kw: Any) -> Iterator[Testbed]:
    """A testbed for a fixture of any scope, under the policy above; stopped on exit."""
    _require_testbed()
    tb = Testbed.start(hosts, **kw)
    try:
        yield tb
    finally:
        tb.stop()


def module_testbed(specs: Any, **kw: Any) -> Any:
    """A module's own testbed as its fixture ``tb`` (``tb = module_testbed(specs)``): started
    for the module's first test that asks, stopped after its last; ``kw``: Testbed.start's."""

    @pytest.fixture(scope="module")
    def tb() -> Iterator[Testbed]:
        with started_testbed(specs, **kw) as bed:
            yield bed

    return tb


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    with started_testbed(SESSION_HOSTS) as tb:
        yield tb


@pytest.fixture
def testbed_clean(testbed: Testbed) -> Iterator[Testbed]:
    testbed.reset()
    yield testbed
    testbed.reset()


@pytest.fixture
def make_testbed() -> Iterator[Callable[..., Testbed]]:
    """`make_testbed([HostSpec("a", profile="h200"), "b"], images_needed=True) -> Testbed`."""
    _require_testbed()
    made: list[Testbed] = []

    def make(hosts: Any, **kw: Any) -> Testbed:
        tb = Testbed.start(hosts, **kw)
        made.append(tb)
        return tb

    try:
        yield make
    finally:
        for tb in made:
            tb.stop()


@pytest.fixture(scope="session")
def cli() -> Cli:
    return Cli()
