"""Where the tests read the project's shared data (BRIEF: ``../shared`` beside the repo root,
never a machine's absolute path). The real vLLM 0.33.0 and 0.34.0 dumps the tests need are
copied under tests/, so every checkout runs them; test_shared_copies.py holds each copy to its
original wherever ``../shared`` is there. No other test names ``../shared`` as a path
(tests/unit/repo/test_shared_data_only.py holds it): a user's clone has none."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_VLLM = SHARED / "fixtures" / "vllm-0.33.0"
SHARED_VLLM_034 = SHARED / "fixtures" / "vllm-0.34.0"
SHARED_H200 = SHARED / "fixtures" / "h200-host"
SHARED_TOPO = SHARED / "fixtures" / "topo"

# copies of SHARED_VLLM/<name>, byte for byte
METRICS_JSON = REPO / "tests" / "unit" / "fixtures" / "vllm" / "metrics.json"
NIXL_MESSAGES_JSON = REPO / "tests" / "unit" / "fixtures" / "vllm" / "nixl-messages.json"
SERVE_ARGS_JSON = REPO / "tests" / "testbed" / "standin" / "serve-args.json"
# copies of SHARED_VLLM_034/<name>
NIXL_MESSAGES_034_JSON = REPO / "tests" / "unit" / "fixtures" / "vllm-0.34.0" / "nixl-messages.json"
SERVE_ARGS_034_JSON = REPO / "tests" / "testbed" / "standin" / "serve-args-0.34.0.json"
# copies of SHARED_H200/*.txt and SHARED_TOPO/*.txt (the h200 README adds a paragraph on facts)
H200_HOST = REPO / "tests" / "unit" / "fixtures" / "h200-host"
TOPO = REPO / "tests" / "unit" / "fixtures" / "topo"
COPIES = {
    METRICS_JSON: SHARED_VLLM / "metrics.json",
    NIXL_MESSAGES_JSON: SHARED_VLLM / "nixl-messages.json",
    SERVE_ARGS_JSON: SHARED_VLLM / "serve-args.json",
    NIXL_MESSAGES_034_JSON: SHARED_VLLM_034 / "nixl-messages.json",
    SERVE_ARGS_034_JSON: SHARED_VLLM_034 / "serve-args.json",
}
for _copy_dir, _shared_dir in ((H200_HOST, SHARED_H200), (TOPO, SHARED_TOPO)):
    for _copy in sorted(_copy_dir.glob("*.txt")):
        COPIES[_copy] = _shared_dir / _copy.name
