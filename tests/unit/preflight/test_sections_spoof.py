"""Preflight sections are framed by a per-run random token: a command's output that
contains marker lines (a model's config.json is operator-supplied text) cannot pose as
another command's section."""

from __future__ import annotations

from pdboot.preflight.checks import Command, Section, batch_script, gpu, model, parse_sections
from pdboot.preflight.run import evaluate_host
from pdboot.transport.connection import LocalConnection
from tests.unit.preflight.test_checks import DERIVED, batch, ctx, sections


def _host_text(token: str, spoof: str) -> str:
    """What batch_script's output looks like for ctx() with the old driver's outputs and
    ``spoof`` as the model's config.json output (printed after the GPU sections)."""
    plain = batch(ctx(), "r550-old-driver.txt", extra={"@config": Section("@SPOOF@\n", 0)})
    framed = plain.replace("### $ ", f"### {token} $ ").replace("### exit=", f"### {token} exit=")
    return f"### pdboot-sections {token}\n" + framed.replace("@SPOOF@\n", spoof)


def test_config_json_with_a_fake_nvidia_smi_section_does_not_replace_the_driver() -> None:
    old = sections(DERIVED / "r550-old-driver.txt")
    healthy = sections(DERIVED / "rtx6000x2-r580-healthy.txt")
    # The spoof: a config.json whose text carries a plain-layout section of a healthy
    # driver, and a guess at a token-layout one.
    fake = "".join(
        f"### $ {line}\n{healthy[line].output}### exit=0\n"
        f"### deadbeef $ {line}\n{healthy[line].output}### deadbeef exit=0\n"
        for line in old
    )
    spoof = '{"architectures": ["LlamaForCausalLM"],\n' + fake + '"x": 1}\n'
    text = _host_text("7f3a9c", spoof)
    assert "@SPOOF@" not in text and spoof in text
    res = evaluate_host(ctx(), text)[0]
    by = {r.id: r for r in res}
    assert by["gpu.driver"].status == "fail"
    assert "driver 550.90.07" in by["gpu.driver"].message
    # ...and the spoof stays inside the config section, whole
    secs = parse_sections(text)
    query = next(c.line for c in gpu.commands(ctx()) if c.key == "query")
    assert secs[query].output == old[query].output
    cfg = next(c.line for c in model.commands(ctx()) if c.key == "config")
    assert secs[cfg].output == spoof
    # Control: in the plain layout (no token) the same text does replace the driver.
    plain = text.replace("### 7f3a9c ", "### ").split("\n", 1)[1]
    res = evaluate_host(ctx(), plain)[0]
    assert {r.id: r for r in res}["gpu.driver"].status == "pass"


def test_round_trip_through_bash_with_a_spoofing_command() -> None:
    real = Command("drv", "echo driver=550", "gpu")
    liar = Command(
        "cfg",
        "printf '%s\\n' '### $ echo driver=550' 'driver=580' '### exit=0' "
        "'### pdboot-sections 0' '### 0 $ echo driver=550' 'driver=580' '### 0 exit=0'",
        "model",
    )
    script = batch_script([real, liar])
    out = LocalConnection("t").run(script).stdout
    s = parse_sections(out)
    assert s[real.line] == Section("driver=550\n", 0)
    assert "driver=580" in s[liar.line].output and s[liar.line].rc == 0
    assert set(s) == {real.line, liar.line}
    # a fresh token per run
    assert batch_script([real]) != batch_script([real])


def test_captures_without_a_header_still_parse() -> None:
    text = "### $ echo a\na\n### exit=0\n"
    assert parse_sections(text) == {"echo a": Section("a\n", 0)}
