"""`render --out DIR`: DIR/<host>/compose.yaml per host (the proxy's nginx.conf beside each
ingress host's, keepalived.conf where a virtual IP moves), DIR/summary.txt, and the folders
of hosts an earlier deployment had, found so that render refuses them or, with --clean,
removes what render wrote there and nothing else (as `helm template --output-dir` leaves
no stale manifest behind a changed chart)."""

from __future__ import annotations

from pathlib import Path

from pdboot.plan.model import KEEPALIVED_CONF_FILE, PROXY_CONF_FILE

COMPOSE_FILE = "compose.yaml"
SUMMARY_FILE = "summary.txt"
# the files render writes in a host's folder
RENDERED = (COMPOSE_FILE, PROXY_CONF_FILE, KEEPALIVED_CONF_FILE)


def stale_host_dirs(out_dir: Path, hosts: set[str]) -> list[Path]:
    """The folders in `out_dir` holding a rendered project of a host not in `hosts`."""
    if not out_dir.is_dir():
        return []
    return sorted(
        d
        for d in out_dir.iterdir()
        if d.is_dir() and d.name not in hosts and (d / COMPOSE_FILE).is_file()
    )


def remove_stale(dirs: list[Path]) -> list[Path]:
    """Remove the files render wrote in each folder, then the folder when nothing else is
    left; returns the folders kept because they hold files render did not write."""
    kept = []
    for d in dirs:
        for name in RENDERED:
            (d / name).unlink(missing_ok=True)
        if any(d.iterdir()):
            kept.append(d)
        else:
            d.rmdir()
    return kept


def write_projects(
    out_dir: Path, texts: dict[str, str], beside: dict[str, dict[str, str]], summary: str
) -> list[Path]:
    """Write every host's project, the files ``beside`` names for it (file name -> text, none
    secret) and the summary; returns the compose files written."""
    written = []
    for name, text in texts.items():
        target = out_dir / name / COMPOSE_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
        for file, text in beside.get(name, {}).items():
            (target.parent / file).write_text(text, encoding="utf-8")
    (out_dir / SUMMARY_FILE).write_text(summary, encoding="utf-8")
    return written
