"""`pdboot export k8s|slurm --out -`, as `helm template` prints: only the manifests on stdout
(`| kubectl apply -f -`, `| sbatch`), the notes on stderr, and no folder named `-`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdboot.cli.export import to_stream
from pdboot.cli.main import app
from tests.unit.paths import UNIT

ONE = str(UNIT / "inventories" / "1p1d.yaml")


def _export(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["export", *args])
    return result.exit_code, result.stdout, result.stderr


def test_k8s_to_stdout_is_the_manifests_the_folder_gets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _export("k8s", ONE, "--out", "-", "--llm-d", "--download-at-start")
    assert code == 0, err
    assert not Path("-").exists()
    code, _, _ = _export("k8s", ONE, "--out", "dir", "--llm-d", "--download-at-start")
    assert code == 0
    written = sorted(p for p in Path("dir").rglob("*.yaml"))
    assert len(written) == 4
    in_files = [d for p in written for d in yaml.safe_load_all(p.read_text()) if d]
    streamed = [d for d in yaml.safe_load_all(out) if d]
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, streamed)) == sorted(map(key, in_files))
    assert sorted(streamed, key=key) == sorted(in_files, key=key)
    for p in written:
        assert f"# Source: {p.relative_to('dir')}\n" in out
    # the notes (README.md) go to stderr, whole (the unpinned weights' warning beside them);
    # stdout holds no "wrote" line
    assert Path("dir/README.md").read_text() in err
    assert "wrote" not in out and "README" not in out


def test_slurm_to_stdout_is_the_batch_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _export("slurm", ONE, "--out", "-", "--download-at-start")
    assert code == 0, err
    code, _, _ = _export("slurm", ONE, "--out", "dir", "--download-at-start")
    assert code == 0
    (script,) = Path("dir").iterdir()
    assert out == script.read_text() and out.startswith("#!/bin/bash\n")
    assert not Path("-").exists()


def test_files_that_cannot_share_a_stream_are_refused() -> None:
    with pytest.raises(ValueError, match=r"a\.sbatch, b\.sbatch"):
        to_stream({"a.sbatch": "#!/bin/sh\n", "b.sbatch": "#!/bin/sh\n"})
    out, notes = to_stream({"x.yaml": "---\na: 1\n", "y.yaml": "b: 2\n", "README.md": "hi\n"})
    assert out == "---\n# Source: x.yaml\na: 1\n---\n# Source: y.yaml\nb: 2\n"
    assert notes == "hi\n"
