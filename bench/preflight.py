"""Benchmark: wall time of `pdboot preflight` against the same commands sent by
(a) plain `ssh` to every host in parallel, one connection per host (the floor), and
(b) an Ansible playbook, one task per command (what operators would otherwise write);
and first the start-up cost every command pays: `pdboot --version` (a fresh process each
time) against a bare `python -c pass`, in the same run.

All three run the exact same command lines (pdboot's batch for each host), in the same
testbed, interleaved run by run; the medians and their ratios are printed. On a small
machine every test host shares the CPU, so compare ratios, not absolute times.

    python bench/preflight.py [--hosts 2 8] [--runs 5] [--ansible PATH/TO/ansible-playbook]
    python bench/preflight.py --hosts --runs 20     # only the start-up figures (no root)

Ansible is a benchmark-only dependency: `python -m venv /var/tmp/pdboot-bench-venv &&
/var/tmp/pdboot-bench-venv/bin/pip install ansible-core` (the default path used here).
Needs root (the testbed: network namespaces, sshd, dockerd).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdboot.inventory.load import load_inventory  # noqa: E402
from pdboot.preflight.checks import batch_script  # noqa: E402
from pdboot.preflight.contexts import contexts  # noqa: E402
from pdboot.preflight.run import host_commands  # noqa: E402
from tests.testbed.harness import HostSpec, Testbed  # noqa: E402

DEFAULT_ANSIBLE = "/var/tmp/pdboot-bench-venv/bin/ansible-playbook"


def roles(names: list[str]) -> dict[str, Any]:
    half = max(1, len(names) // 2)
    decode, prefill = names[:half], names[half:] or names[:1]
    return {"decode": decode, "prefill": prefill, "router": names[-1]}


def time_pdboot(inv: Path) -> float:
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "pdboot", "preflight", str(inv), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    dt = time.monotonic() - t0
    doc = json.loads(p.stdout)
    if p.returncode not in (0, 1) or not all(h["reachable"] for h in doc["hosts"].values()):
        raise SystemExit(f"pdboot preflight did not reach every host:\n{p.stdout}\n{p.stderr}")
    return dt


def time_ssh(tb: Testbed, scripts: dict[str, str]) -> float:
    t0 = time.monotonic()
    procs = {
        h: subprocess.Popen(
            tb.ssh_argv(h, "bash -s"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for h in scripts
    }
    for h, p in procs.items():
        out, err = p.communicate(scripts[h], timeout=300)
        if p.returncode != 0 or " exit=" not in out:  # "### <run token> exit=N"
            raise SystemExit(f"plain ssh to {h} failed: rc={p.returncode} {err}")
    return time.monotonic() - t0


def write_ansible(tb: Testbed, commands: dict[str, list[str]], d: Path) -> tuple[Path, Path]:
    inv = d / "hosts.ini"
    lines = ["[all]"]
    for h in commands:
        lines.append(f"{h} ansible_host={tb.hosts[h].address}")
    lines += [
        "[all:vars]",
        "ansible_user=root",
        f"ansible_ssh_private_key_file={tb.identity_file}",
        "ansible_python_interpreter=/usr/bin/python3",
        f"ansible_ssh_common_args='-F /dev/null -o UserKnownHostsFile={tb.known_hosts} "
        "-o StrictHostKeyChecking=yes'",
    ]
    inv.write_text("\n".join(lines) + "\n")
    # one task per distinct command line; a task some hosts do not run is skipped there
    order: list[str] = []
    who: dict[str, list[str]] = {}
    for h, cmds in commands.items():
        for c in cmds:
            if c not in who:
                order.append(c)
                who[c] = []
            who[c].append(h)
    tasks = []
    for i, c in enumerate(order):
        task: dict[str, Any] = {
            "name": f"command {i}",
            "ansible.builtin.shell": c,
            "args": {"executable": "/bin/bash"},
            "ignore_errors": True,
            "changed_when": False,
        }
        if len(who[c]) != len(commands):
            task["when"] = f"inventory_hostname in {who[c]!r}"
        tasks.append(task)
    play = [{"hosts": "all", "gather_facts": False, "tasks": tasks}]
    pb = d / "preflight.yml"
    pb.write_text(json.dumps(play, indent=1))  # JSON is YAML
    return inv, pb


def time_ansible(playbook_bin: str, inv: Path, pb: Path, n: int) -> float:
    ctl = tempfile.mkdtemp(prefix="pdb-ans-cp-")  # fresh ControlPersist sockets per run
    env = dict(
        os.environ,
        ANSIBLE_HOST_KEY_CHECKING="True",
        ANSIBLE_PIPELINING="True",
        ANSIBLE_FORKS=str(max(5, n)),
        ANSIBLE_SSH_CONTROL_PATH_DIR=ctl,
        ANSIBLE_LOCAL_TEMP=ctl,
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_RETRY_FILES_ENABLED="False",
    )
    t0 = time.monotonic()
    p = subprocess.run(
        [playbook_bin, "-i", str(inv), str(pb)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    dt = time.monotonic() - t0
    # kill the ControlPersist masters this run left (ssh -O exit on each socket)
    for sock in Path(ctl).glob("*"):
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True)
    shutil.rmtree(ctl, ignore_errors=True)
    if p.returncode != 0 or "unreachable=0" not in p.stdout:
        raise SystemExit(f"ansible failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr}")
    return dt


def time_process(argv: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, capture_output=True, check=True, cwd=ROOT, timeout=60)
    return time.monotonic() - t0


def startup(runs: int) -> dict[str, float]:
    """Medians of `python -m pdboot --version` and of a bare interpreter, interleaved."""
    times: dict[str, list[float]] = {"version": [], "python": []}
    time_process([sys.executable, "-m", "pdboot", "--version"])  # warm the page cache
    for _ in range(runs):
        times["version"].append(time_process([sys.executable, "-m", "pdboot", "--version"]))
        times["python"].append(time_process([sys.executable, "-c", "pass"]))
    return {k: statistics.median(v) for k, v in times.items()}


def bench(n: int, runs: int, playbook_bin: str | None) -> dict[str, float]:
    tb = Testbed.start([HostSpec(f"h{i}") for i in range(n)], images_needed=False)
    try:
        work = Path(tempfile.mkdtemp(prefix="pdb-bench-"))
        inv = tb.inventory(work / "inv.yaml", **roles(list(tb.hosts)))
        ctxs = contexts(load_inventory(inv))
        cmds = {h: [c.line for c in host_commands(ctx)] for h, ctx in ctxs.items()}
        scripts = {h: batch_script(host_commands(ctx)) for h, ctx in ctxs.items()}
        ans = write_ansible(tb, cmds, work) if playbook_bin else None
        times: dict[str, list[float]] = {"pdboot": [], "ssh": [], "ansible": []}
        time_pdboot(inv)  # warm caches (imports, page cache) once, untimed
        for _ in range(runs):
            times["pdboot"].append(time_pdboot(inv))
            times["ssh"].append(time_ssh(tb, scripts))
            if ans and playbook_bin:
                times["ansible"].append(time_ansible(playbook_bin, *ans, n))
        per_host = statistics.mean(len(c) for c in cmds.values())
        print(f"  {n} hosts, {per_host:.0f} commands per host, {runs} runs")
        return {k: statistics.median(v) for k, v in times.items() if v}
    finally:
        tb.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="*", default=[2, 8])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--ansible",
        default=DEFAULT_ANSIBLE,
        help="ansible-playbook to use ('' to leave Ansible out)",
    )
    args = ap.parse_args()
    playbook_bin = args.ansible if args.ansible and Path(args.ansible).exists() else None
    if args.ansible and not playbook_bin:
        print(f"(no {args.ansible}: Ansible left out)")
    s = startup(max(args.runs, 5))
    print(
        f"start-up ({max(args.runs, 5)} runs, medians): `python -m pdboot --version` "
        f"{s['version']:.3f} s, bare `python -c pass` {s['python']:.3f} s; pdboot's own "
        f"share {s['version'] - s['python']:.3f} s ({s['version'] / s['python']:.2f}x)"
    )
    rows = []
    for n in args.hosts:
        med = bench(n, args.runs, playbook_bin)
        rows.append((n, med))
    if not rows:
        return
    print()
    print(
        "| hosts | pdboot preflight | plain ssh (floor) | Ansible, task per command "
        "| pdboot / ssh | Ansible / pdboot |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for n, med in rows:
        pd, ssh, a = med["pdboot"], med["ssh"], med.get("ansible")
        a_txt = f"{a:.2f} s" if a else "n/a"
        ratio = f"{a / pd:.1f}x" if a else "n/a"
        print(f"| {n} | {pd:.2f} s | {ssh:.2f} s | {a_txt} | {pd / ssh:.2f}x | {ratio} |")


if __name__ == "__main__":
    main()
