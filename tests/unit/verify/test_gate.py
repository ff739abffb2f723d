"""The correctness gate's request and classification rules."""

from __future__ import annotations

import json

from pdboot.verify import gate

REF = " Venus is the hottest planet. Earth has liquid water on its surface and one moon. Mars"


def test_request_is_greedy_fixed_and_seeded() -> None:
    body = gate.gate_request("Qwen/Qwen3-0.6B")
    assert body["temperature"] == 0 and body["seed"] == gate.GATE_SEED
    assert body["prompt"] == gate.GATE_PROMPT and body["model"] == "Qwen/Qwen3-0.6B"
    assert 24 <= body["max_tokens"] <= 64 and body["stream"] is False


def test_answer_text_completion_and_chat_and_junk() -> None:
    comp = {"choices": [{"index": 0, "text": REF, "finish_reason": "length"}]}
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": REF}}]}
    assert gate.answer_text(json.dumps(comp)) == REF
    assert gate.answer_text(json.dumps(chat)) == REF
    assert gate.answer_text('{"error": {"message": "x"}}') is None
    assert gate.answer_text("<html>") is None


def test_identical_passes() -> None:
    out = gate.classify(REF, REF)
    assert out.verdict == "identical" and out.ok and "equals" in out.message()


def test_late_divergence_warns_with_both_outputs() -> None:
    late = REF.replace("one moon. Mars", "one large moon.")
    out = gate.classify(late, REF)
    assert out.verdict == "late_divergence" and out.level == "warn" and out.ok
    assert out.common == len(gate.pieces(REF)) - 2
    msg = out.message()
    assert repr(late) in msg and repr(REF) in msg and "numerics" in msg


def test_divergence_at_once_is_a_broken_kv_path() -> None:
    garbage = " Venus lantern orbit seven quietly the the of Mars"  # first token from prefill
    out = gate.classify(garbage, REF)
    assert out.verdict == "broken" and out.level == "fail" and not out.ok
    assert out.common == 1
    msg = out.message()
    assert "dynamo#12463" in msg and "vllm#52617" in msg and "GPUDirect" in msg


def test_boundary_of_the_rule() -> None:
    words = gate.pieces(REF)
    just_late = "".join(words[: gate.LATE_AFTER]) + " different"
    just_early = "".join(words[: gate.LATE_AFTER - 1]) + " different"
    assert gate.classify(just_late, REF).verdict == "late_divergence"
    assert gate.classify(just_early, REF).verdict == "broken"


def test_empty_answer_fails() -> None:
    for pd, direct in (("", REF), (REF, None), ("  ", "  ")):
        out = gate.classify(pd, direct)
        assert out.verdict == "broken" and "empty" in out.message()


def _answers(router: tuple[int, str], decode: tuple[int, str]) -> gate.Post:
    def post(url: str, body: dict[str, object]) -> tuple[int, str]:
        assert url.endswith("/v1/completions") and body == gate.gate_request("m")
        return router if url.startswith("http://router") else decode

    return post


def _body(text: str) -> str:
    return json.dumps({"choices": [{"index": 0, "text": text}]})


def test_run_gate_compares_router_and_decode() -> None:
    ok = gate.run_gate(
        _answers((200, _body(REF)), (200, _body(REF))),
        "http://router:8000/",
        "http://decode:8200",
        "m",
    )
    assert ok.verdict == "identical"
    bad = gate.run_gate(
        _answers((200, _body(" Venus x y z")), (200, _body(REF))),
        "http://router:8000",
        "http://decode:8200",
        "m",
    )
    assert bad.verdict == "broken" and bad.pd_text == " Venus x y z"


def test_run_gate_http_error_fails_with_the_error() -> None:
    out = gate.run_gate(
        _answers((500, '{"error": {"message": "KV transfer failed"}}'), (200, _body(REF))),
        "http://router:8000",
        "http://d:1",
        "m",
    )
    assert out.verdict == "broken" and "HTTP 500" in out.pd_text
    assert "KV transfer failed" in out.message()
