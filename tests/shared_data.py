"""Where the tests read the project's shared data (BRIEF: ``../shared`` beside the repo root,
never a machine's absolute path). The real vLLM 0.33.0 dumps the tests need are copied under
tests/, so every checkout runs them; test_shared_copies.py holds each copy to its original
wherever ``../shared`` is there."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_VLLM = SHARED / "fixtures" / "vllm-0.33.0"

# copies of SHARED_VLLM/<name>, byte for byte
METRICS_JSON = REPO / "tests" / "unit" / "fixtures" / "vllm" / "metrics.json"
NIXL_MESSAGES_JSON = REPO / "tests" / "unit" / "fixtures" / "vllm" / "nixl-messages.json"
SERVE_ARGS_JSON = REPO / "tests" / "testbed" / "standin" / "serve-args.json"
COPIES = {
    METRICS_JSON: "metrics.json",
    NIXL_MESSAGES_JSON: "nixl-messages.json",
    SERVE_ARGS_JSON: "serve-args.json",
}
