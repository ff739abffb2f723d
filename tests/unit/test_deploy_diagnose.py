"""Known failure signatures, on log lines as real vLLM/PyTorch/CUDA/huggingface_hub print them."""

from __future__ import annotations

import pytest

from pdboot.diagnose import diagnose

CASES = [
    (
        "cuda_oom",
        [
            "INFO 11-29 10:00:01 [gpu_model_runner.py:2000] Loading model weights took 14.99 GiB",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 94.97 GiB of which 1.12 GiB is free.",
        ],
    ),
    (
        "kv_transfer_config",
        [
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for KVTransferConfig",
            "kv_rank",
            "  Extra inputs are not permitted [type=extra_forbidden, input_value=0, "
            "input_type=int]",
        ],
    ),
    (
        "gated_model",
        [
            "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-abc)",
            "Cannot access gated repo for url https://huggingface.co/meta-llama/"
            "Llama-3.1-8B-Instruct/resolve/main/config.json.",
        ],
    ),
    (
        "wrong_cuda",
        [
            "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda "
            "functions before calling NumCudaDevices() that might have already set an error? "
            "Error 804: forward compatibility was attempted on non supported HW",
        ],
    ),
    (
        "wrong_cuda",
        ["CUDA driver version is insufficient for CUDA runtime version"],
    ),
    (
        "nixl_handshake",
        [
            "RuntimeError: Remote NIXL agent engine ID mismatch. Expected 9690d2d6-a66f,"
            "received 495b4444-8935.",
        ],
    ),
    (
        "nixl_handshake",
        ["RuntimeError: NIXL compatibility hash mismatch. Local: dbe0, Remote: f2f6. "],
    ),
    (
        "address_in_use",
        [
            "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8200): "
            "address already in use"
        ],
    ),
]


@pytest.mark.parametrize(("expected", "lines"), CASES)
def test_known_signatures(expected: str, lines: list[str]) -> None:
    d = diagnose(lines)
    assert d is not None and d.id == expected
    assert d.message


def test_unknown_log_has_no_diagnosis() -> None:
    assert (
        diagnose(
            ["INFO Starting vLLM API server on http://0.0.0.0:8200", "Traceback", "KeyError: 'x'"]
        )
        is None
    )


def test_last_matching_line_wins() -> None:
    lines = [
        "WARNING address already in use, retrying on another port",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
    ]
    d = diagnose(lines)
    assert d is not None and d.id == "cuda_oom"
