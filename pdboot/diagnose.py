"""One-line diagnoses for engine logs that match a known failure (pure).

The signatures are the texts real vLLM, PyTorch, CUDA, huggingface_hub and NIXL print:
``torch.OutOfMemoryError: CUDA out of memory``, vLLM's ``RuntimeError: Remote NIXL agent
engine ID mismatch`` / ``NIXL compatibility hash mismatch``, pydantic's ``Extra inputs are
not permitted`` for ``KVTransferConfig``, huggingface_hub's ``GatedRepoError`` / ``401 Client
Error``, CUDA's ``CUDA driver version is insufficient for CUDA runtime version`` and error
804 ``forward compatibility was attempted on non supported HW``, and ``[Errno 98] Address
already in use``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    id: str
    pattern: re.Pattern[str]
    diagnosis: str


def _sig(id_: str, pattern: str, diagnosis: str) -> Signature:
    return Signature(id_, re.compile(pattern, re.IGNORECASE), diagnosis)


SIGNATURES: tuple[Signature, ...] = (
    _sig(
        "kv_transfer_config",
        r"validation error(s)? for KVTransferConfig|Extra inputs are not permitted"
        r"|Invalid value for --kv-transfer-config|kv-transfer-config: (invalid|expected)",
        "invalid --kv-transfer-config: vLLM rejects unknown or malformed fields "
        "(old kv_rank/kv_ip/kv_parallel_size/kv_buffer_size keys?); fix kv_transfer "
        "in the inventory",
    ),
    _sig(
        "cuda_oom",
        r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks"
        r"|larger than the maximum number of tokens that can be stored in KV cache",
        "GPU out of memory: lower --gpu-memory-utilization / --max-model-len, raise "
        "tensor_parallel_size, or free the GPU (another process on it?)",
    ),
    _sig(
        "gated_model",
        r"GatedRepoError|Cannot access gated repo|You are trying to access a gated repo"
        r"|401 Client Error|Unauthorized for url|Invalid user token"
        r"|Repository Not Found for url",
        "the model is gated or private and the Hugging Face token is missing, invalid or "
        "lacks access: set secrets.hf_token and accept the model's license on the Hub",
    ),
    _sig(
        "wrong_cuda",
        r"CUDA driver version is insufficient|forward compatibility was attempted"
        r"|NVIDIA driver on your system is too old|unsupported display driver / cuda driver"
        r"|cudaErrorInsufficientDriver|Error 804",
        "the image's CUDA is newer than the host's driver: upgrade the driver (CUDA 13 "
        "needs R580+) or use an image built for the installed CUDA",
    ),
    _sig(
        "nixl_handshake",
        r"NIXL agent engine ID mismatch|NIXL compatibility hash mismatch"
        r"|NIXL handshake (failed|error)|handshake_setup_failed|nixlBackendError"
        r"|NIXL is not available",
        "NIXL handshake failed: check VLLM_NIXL_SIDE_CHANNEL_HOST is each prefill host's "
        "routable address, the side-channel ports are reachable, and both tiers run the "
        "same image and model string",
    ),
    _sig(
        "address_in_use",
        r"Address already in use|address already in use|EADDRINUSE",
        "a port is already in use on the host (engine HTTP port or NIXL side channel): "
        "stop what holds it or change the port in the inventory",
    ),
)


@dataclass(frozen=True)
class Diagnosis:
    id: str
    message: str
    line: str  # the log line that matched


def diagnose(lines: Sequence[str]) -> Diagnosis | None:
    """The known failure nearest the end of the log, or None.

    The last matching line wins: a crash usually prints its cause last, after any
    earlier, recovered warnings."""
    for line in reversed(lines):
        for sig in SIGNATURES:
            if sig.pattern.search(line):
                return Diagnosis(sig.id, sig.diagnosis, line.strip())
    return None
