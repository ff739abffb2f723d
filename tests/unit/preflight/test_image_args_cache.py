"""The image parser's verdicts kept on pdboot's machine (pdboot/preflight/args_cache.py) and the
one path `up` and preflight share (image_args.judge, args_preflight.host_check). The probe is
run for real, as a python3 process over the stand-in's emulated `vllm` package (the same as
tests/unit/test_image_args.py); what stands for Docker here is only the answer of `docker
image inspect` (an image ID, or "No such image"). On the testbed, through real Docker:
tests/e2e/test_preflight_image_args.py; on the REAL vllm-cpu image:
tests/e2e/real_engine/test_image_args_real.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdboot.preflight import args_cache, args_preflight
from pdboot.preflight import image_args as ia
from pdboot.preflight.checks import batch_script
from pdboot.transport.connection import CommandResult, LocalConnection
from tests.unit.paths import ROOT

SITE = ROOT / "tests" / "testbed" / "emulated_site"
STANDIN = ROOT / "tests" / "testbed" / "standin"
IMAGE_ID = "sha256:" + "ab" * 32

CMDS = {
    "prefill@a": ["m", "--max-model-len", "2048"],
    "decode@b": ["m", "--max-num-inflight-kv-loads", "4"],  # 0.34 only
}


class Host:
    """What `run` reaches: `docker image inspect` answers ``image_id`` (or no such image);
    the probe's container is the probe's own python3 over the emulated package."""

    def __init__(self, image_id: str | None, version: str = "0.33.0") -> None:
        self.image_id, self.version, self.probes = image_id, version, 0

    def run(self, argv: list[str], timeout: float) -> tuple[int, str]:
        if argv[:3] == ["docker", "image", "inspect"]:
            if self.image_id is None:
                return 1, f"Error response from daemon: No such image: {argv[-1]}\n"
            return 0, self.image_id + "\n"
        assert argv[:7] == ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3"]
        self.probes += 1
        env = dict(
            os.environ,
            PYTHONPATH=str(SITE),
            VLLM_STANDIN_DIR=str(STANDIN),
            VLLM_STANDIN_VERSION=self.version,
        )
        res = subprocess.run(
            [sys.executable, *argv[8:]], capture_output=True, text=True, env=env, timeout=60
        )
        return res.returncode, res.stdout + res.stderr


def cache(tmp_path: Path, probe: str = ia.PROBE) -> args_cache.Cache:
    return args_cache.Cache(tmp_path / "image-args", probe)


def test_an_absent_image_is_a_skip_note_and_starts_no_container(tmp_path: Path) -> None:
    host = Host(None)
    images = {"reg/vllm:nightly": CMDS}
    ids = {"reg/vllm:nightly": ia.read_id(*host.run(ia.inspect_argv("reg/vllm:nightly"), 5))}
    (note,) = args_preflight.host_check(host.run, images, ids, cache(tmp_path))
    assert note.id == "docker.image_args" and note.status == "skip"
    assert "reg/vllm:nightly is not on this host yet" in note.message
    assert "`up` checks" in note.message and "after the pull" in note.message
    assert host.probes == 0 and not (tmp_path / "image-args").exists()


def test_a_present_image_is_judged_once_then_read_from_the_cache(tmp_path: Path) -> None:
    host, kept = Host(IMAGE_ID), cache(tmp_path)
    images = {"reg/vllm:nightly": CMDS}
    ids = {"reg/vllm:nightly": (IMAGE_ID, "")}
    first = args_preflight.host_check(host.run, images, ids, kept)
    assert host.probes == 1
    (fail,) = [r for r in first if r.status == "fail"]
    assert fail.message.startswith("decode@b: the image's vLLM 0.33.0 refuses ")
    assert "--max-num-inflight-kv-loads" in fail.message and "parsed in" in fail.message
    assert len(first) == 1  # the prefill's command passes: only the refusal is reported

    # what the cache records: the image's version and options, one verdict per argv
    (path,) = (tmp_path / "image-args").glob("*/*.json")
    assert path.name == "ab" * 32 + ".json"
    rec = json.loads(path.read_text())
    assert rec["image_id"] == IMAGE_ID and rec["version"] == "0.33.0"
    assert "--max-model-len" in rec["options"]
    verdicts = rec["verdicts"]
    assert set(verdicts) == {args_cache.argv_key(a) for a in CMDS.values()}
    assert verdicts[args_cache.argv_key(CMDS["prefill@a"])]["error"] == ""
    refused = verdicts[args_cache.argv_key(CMDS["decode@b"])]
    assert "unrecognized arguments: --max-num-inflight-kv-loads" in refused["error"]

    # the second run starts no container: the same verdict, saying when it was judged
    (again,) = args_preflight.host_check(host.run, images, ids, kept)
    assert host.probes == 1
    assert again.status == "fail" and "the image's vLLM 0.33.0 refuses" in again.message
    assert f"the verdict cached on pdboot's machine, judged {refused['checked_at']}" in (
        again.message
    )
    assert again.fix == fail.fix


def test_the_cache_is_shared_by_engine_names_but_not_by_argv_image_or_probe(
    tmp_path: Path,
) -> None:
    host, kept = Host(IMAGE_ID, "0.34.0"), cache(tmp_path)
    assert ia.judge(host.run, "img", CMDS, kept)[0].status == "pass"
    assert host.probes == 1
    # the same argv under other engine names (another host, `up` after preflight): cached
    renamed = {f"x{i}@c": a for i, a in enumerate(CMDS.values())}
    (hit,) = ia.judge(host.run, "img", renamed, kept)
    assert host.probes == 1 and hit.status == "pass" and "cached" in hit.message
    # one new argv: judged by the image
    ia.judge(host.run, "img", {**CMDS, "d2@b": ["m", "--port", "9"]}, kept)
    assert host.probes == 2
    # another image ID, or another probe: judged anew
    other = Host("sha256:" + "cd" * 32, "0.34.0")
    ia.judge(other.run, "img", CMDS, kept)
    assert other.probes == 1
    ia.judge(host.run, "img", CMDS, cache(tmp_path, ia.PROBE + "\n# changed"))
    assert host.probes == 3


def test_a_probe_that_did_not_answer_is_not_kept(tmp_path: Path) -> None:
    kept = cache(tmp_path)

    def broken(argv: list[str], timeout: float) -> tuple[int, str]:
        if argv[:3] == ["docker", "image", "inspect"]:
            return 0, IMAGE_ID
        return 1, "Traceback ...\nModuleNotFoundError: No module named 'vllm'"

    (v,) = ia.judge(broken, "img", CMDS, kept)
    assert v.status == "fail" and "did not answer" in v.message
    assert kept.read(IMAGE_ID) is None


def test_a_new_version_under_an_id_drops_the_old_verdicts(tmp_path: Path) -> None:
    kept = cache(tmp_path)
    kept.store(IMAGE_ID, "0.33.0", ["--a"], {("m", "--a"): ""})
    rec = kept.store(IMAGE_ID, "0.34.0", ["--b"], {("m", "--b"): ""})
    assert set(rec.verdicts) == {args_cache.argv_key(["m", "--b"])}
    assert kept.lookup(IMAGE_ID, [["m", "--a"]]) is None


def test_a_cache_that_cannot_be_written_still_gives_the_verdict(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    host = Host(IMAGE_ID)
    (v,) = ia.judge(host.run, "img", CMDS, args_cache.Cache(blocked / "image-args", ia.PROBE))
    assert v.status == "fail" and "refuses" in v.message and host.probes == 1


@pytest.mark.parametrize("bad", ["", "sha256:../../etc", "sha256:XYZ"])
def test_an_image_id_is_never_a_path(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        cache(tmp_path).path(bad)


def test_where_the_cache_lives() -> None:
    assert args_cache.root({"PDBOOT_CACHE_DIR": "/c"}) == Path("/c/image-args")
    assert args_cache.root({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/pdboot/image-args")
    assert args_cache.root({"HOME": "/h"}) == Path("/h/.cache/pdboot/image-args")


@pytest.mark.parametrize(
    ("rc", "text", "expect"),
    [
        (0, IMAGE_ID + "\n", (IMAGE_ID, "")),
        (1, "Error response from daemon: No such image: x:y\n", ("", "absent")),
        (1, "Error: No such object: x:y\n", ("", "absent")),
        (1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n", None),
    ],
)
def test_the_image_id_from_docker_image_inspect(
    rc: int, text: str, expect: tuple[str, str] | None
) -> None:
    got = ia.image_id(lambda argv, t: (rc, text), "x:y")
    if expect is None:
        assert got[0] == "" and got[1].startswith("Cannot connect to the Docker daemon")
    else:
        assert got == expect


class Counted(LocalConnection):
    """A real local connection that counts its execs and its close."""

    def __init__(self) -> None:
        super().__init__("h")
        self.execs: list[str] = []
        self.closed = 0

    def _exec(self, line: str, timeout: float, stdin: str | None) -> CommandResult:
        self.execs.append(line)
        return super()._exec(line, timeout, stdin)

    def close(self) -> None:
        self.closed += 1


def _batch_output(tmp_path: Path, probes: args_preflight.ArgsProbes, present: str) -> str:
    """The host's batch, run for real through bash, with the inspects the check adds; the
    `docker` it finds answers like Docker's CLI: the ID for ``present``, "No such image"
    for any other reference."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "docker").write_text(
        "#!/bin/sh\n"
        f'[ "$1 $2 $3 $4" = "image inspect --format {{{{.Id}}}}" ] || exit 2\n'
        f'if [ "$5" = {present!r} ]; then echo {IMAGE_ID}; exit 0; fi\n'
        'echo "Error response from daemon: No such image: $5" >&2; exit 1\n'
    )
    (bin_ / "docker").chmod(0o755)
    script = batch_script(probes.batch_commands("h"))
    conn = LocalConnection("h")
    return conn.run(f"PATH={bin_}:$PATH bash -s", stdin=script).stdout


def test_the_batch_tells_which_images_are_there_and_a_cached_one_costs_no_exec(
    tmp_path: Path,
) -> None:
    kept = cache(tmp_path)
    kept.store(IMAGE_ID, "0.33.0", ["--max-model-len"], {tuple(a): "" for a in CMDS.values()})
    images = {"reg/vllm:there": CMDS, "reg/vllm:not there": CMDS}  # a space: quoted
    probes = args_preflight.ArgsProbes({"h": images}, kept)
    lines = [c.line for c in probes.batch_commands("h")]
    assert lines == [
        "docker image inspect --format '{{.Id}}' 'reg/vllm:not there'",
        "docker image inspect --format '{{.Id}}' reg/vllm:there",
    ]
    assert probes.batch_commands("router-only") == []
    output = _batch_output(tmp_path, probes, "reg/vllm:there")
    conn = Counted()
    probes.start("h", conn, output, conn.close)
    found = probes.wait()["h"]
    assert conn.execs == [] and conn.closed == 1  # the cache answered: no second exec
    absent, judged = found
    assert absent.status == "skip" and "reg/vllm:not there is not on this host yet" in (
        absent.message
    )
    assert judged.status == "pass" and "cached on pdboot's machine" in judged.message


def test_no_image_there_closes_at_once_and_starts_nothing(tmp_path: Path) -> None:
    probes = args_preflight.ArgsProbes({"h": {"reg/vllm:x": CMDS}}, cache(tmp_path))
    output = _batch_output(tmp_path, probes, "something else")
    conn = Counted()
    probes.start("h", conn, output, conn.close)
    assert conn.closed == 1 and not probes.threads and conn.execs == []
    (note,) = probes.wait()["h"]
    assert note.status == "skip" and "not on this host yet" in note.message


def test_an_inspect_the_batch_cut_off_is_a_skip_with_the_reason(tmp_path: Path) -> None:
    ids = args_preflight.found_ids(["img"], {})  # the batch ended before its section
    assert ids == {"img": ("", "docker image inspect did not finish")}
    host = Host(IMAGE_ID)
    (note,) = args_preflight.host_check(host.run, {"img": CMDS}, ids, cache(tmp_path))
    assert host.probes == 0
    assert note.status == "skip" and "cannot tell whether img is on this host" in note.message


def test_a_cached_verdict_keeps_the_nixl_warning(tmp_path: Path) -> None:
    """The NIXL and UCX versions the probe read are kept with the verdicts: a second `up` on
    the same image warns as the first did, without a container."""
    kept = cache(tmp_path)
    argv = ("m", "--max-model-len", "2048")
    kept.store(IMAGE_ID, "0.33.0", ["--max-model-len"], {argv: ""}, nixl_version="1.4.2",
               ucx_version="1.19.0")  # fmt: skip
    host = Host(IMAGE_ID)
    results = ia.judge(host.run, "img", {"prefill@a": list(argv)}, kept, known_id=IMAGE_ID)
    assert host.probes == 0
    assert [(r.id, r.status) for r in results] == [(ia.ARGS_ID, "pass"), (ia.NIXL_ID, "warn")]
    assert "NIXL 1.4.2, UCX 1.19.0" in results[1].message
