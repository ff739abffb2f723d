"""Benchmark: wall time of `pdboot preflight` (paramiko, through fabric: the one SSH client)
against the same command lines sent by
(a) plain `ssh` to every host in parallel, one connection per host (the floor),
(b) pyinfra, one `server.shell` operation per host running that host's script, when its
    CLI is installed (`--pyinfra`), and
(c) an Ansible playbook, one task per command line (`--ansible`, opt-in: minutes at 32
    hosts);
and first the start-up cost every command pays: `pdboot --version` (a fresh process each
time) against a bare `python -c pass`, in the same run.

Every tool runs the exact same script per host (pdboot's batch: `batch_script` of
`host_commands` and the image check's inspect, `ArgsProbes.batch_commands`), in the same
testbed, each a fresh process per run; within a run the tools take turns in a rotating
order, so none always goes first after a pause. Medians, their ratios, the load average
around each size and how each tool's time grows with the
hosts are printed. On a small machine every test host shares the CPU: compare ratios.

    python bench/preflight.py [--hosts 2 8 32] [--runs 5] [--pyinfra PATH] [--ansible PATH]
    python bench/preflight.py --hosts --runs 20     # only the start-up figures (no root)

pdboot (and `--before`) run with their bytecode compiled first (`compileall`, as `pip install`
leaves an installed package; pyinfra's and Ansible's are compiled in their venv): without it,
where PYTHONDONTWRITEBYTECODE is set (these sessions' environment), every run compiles
pdboot's ~95 modules from source again. `--no-bytecode` removes pdboot's __pycache__ first
and times that case.

Hosts above --dockerd-max (8) start with sshd only (`HostSpec(..., profile="cpu-only",
dockerd=False)`: cheap; the GPU and docker commands fail fast on every tool alike).
pyinfra and Ansible are benchmark-only dependencies, never project ones: `python -m venv
/var/tmp/pdboot-bench-venv && /var/tmp/pdboot-bench-venv/bin/pip install pyinfra
ansible-core` (the default paths).
Needs root (the testbed: network namespaces, sshd, dockerd).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdboot.inventory.load import load_inventory  # noqa: E402
from pdboot.preflight.args_preflight import ArgsProbes  # noqa: E402
from pdboot.preflight.checks import batch_script  # noqa: E402
from pdboot.preflight.contexts import contexts  # noqa: E402
from pdboot.preflight.run import host_commands  # noqa: E402
from tests.testbed.harness import HostSpec, Testbed  # noqa: E402

VENV = Path("/var/tmp/pdboot-bench-venv/bin")
TOOLS = ("pdboot", "ssh", "pyinfra", "ansible", "before")


def roles(names: list[str]) -> dict[str, Any]:
    half = max(1, len(names) // 2)
    decode, prefill = names[:half], names[half:] or names[:1]
    return {"decode": decode, "prefill": prefill, "router": names[-1]}


def host_spec(name: str, full: bool) -> HostSpec:
    """A GPU host with sshd and dockerd, or (many hosts) sshd only: no dockerd and the
    `cpu-only` profile, so the GPU and docker commands fail fast instead of running the
    emulators (32 emulated GPU hosts would need minutes of CPU per run on 2 cores)."""
    return HostSpec(name) if full else HostSpec(name, profile="cpu-only", dockerd=False)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def time_pdboot(inv: Path, checkout: Path = ROOT) -> float:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "pdboot", "preflight", str(inv), "--json"],
        capture_output=True,
        text=True,
        cwd=checkout,
        env=env,
        timeout=600,
    )
    dt = time.monotonic() - t0
    doc = json.loads(p.stdout)
    if p.returncode not in (0, 1) or not all(h["reachable"] for h in doc["hosts"].values()):
        raise SystemExit(f"pdboot preflight did not reach every host:\n{p.stdout}\n{p.stderr}")
    return dt


def time_ssh(tb: Testbed, scripts: dict[str, str]) -> float:
    """Every host's `ssh ... bash -s < script` at once. Each host's stdin is fed and its
    output read on a thread of its own: `communicate` one host after the other would feed
    a host its script only once the previous one finished (run them in series)."""
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
    with ThreadPoolExecutor(len(procs)) as pool:
        answers = pool.map(lambda h: procs[h].communicate(scripts[h], 600), procs)
        outs = dict(zip(procs, answers, strict=True))
    dt = time.monotonic() - t0
    for h, (out, err) in outs.items():
        if procs[h].returncode != 0 or " exit=" not in out:  # "### <run token> exit=N"
            raise SystemExit(f"plain ssh to {h} failed: rc={procs[h].returncode} {err}")
    return dt


def write_pyinfra(tb: Testbed, scripts: dict[str, str], d: Path) -> tuple[Path, Path]:
    """An inventory (each host with its own script as host data) and a deploy of one
    operation: `bash -c SCRIPT`, the one round trip pdboot makes too."""
    hosts = [
        (
            tb.hosts[h].address,
            {
                "ssh_user": "root",
                "ssh_key": str(tb.identity_file),
                "ssh_known_hosts_file": str(tb.known_hosts),
                "ssh_strict_host_key_checking": "yes",
                "script": script,
            },
        )
        for h, script in scripts.items()
    ]
    inv = d / "pyinfra_inventory.py"
    inv.write_text(f"hosts = {hosts!r}\n")
    deploy = d / "pyinfra_deploy.py"
    deploy.write_text(
        "import shlex\n"
        "from pyinfra import host\n"
        "from pyinfra.operations import server\n"
        "server.shell(name='preflight', commands=['bash -c ' + shlex.quote(host.data.script)])\n"
    )
    return inv, deploy


def time_pyinfra(pyinfra_bin: str, inv: Path, deploy: Path, n: int) -> float:
    t0 = time.monotonic()
    p = subprocess.run(
        [pyinfra_bin, "-y", "--parallel", str(n), str(inv), str(deploy)],
        capture_output=True,
        text=True,
        cwd=inv.parent,
        timeout=600,
    )
    dt = time.monotonic() - t0
    if p.returncode != 0 or "Success" not in p.stdout + p.stderr:
        raise SystemExit(f"pyinfra failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr}")
    return dt


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
        timeout=1200,
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


def bench(
    n: int, runs: int, tools: dict[str, str | None], dockerd: bool, before: Path | None
) -> dict[str, Any]:
    specs = [host_spec(f"h{i}", dockerd) for i in range(n)]
    tb = Testbed.start(specs, images_needed=False)
    try:
        work = Path(tempfile.mkdtemp(prefix="pdb-bench-", dir=tb.dir))
        inv = tb.inventory(work / "inv.yaml", **roles(list(tb.hosts)))
        loaded = load_inventory(inv)
        ctxs, args = contexts(loaded), ArgsProbes.of(loaded, True)
        every = {h: host_commands(ctx) + args.batch_commands(h) for h, ctx in ctxs.items()}
        cmds = {h: [c.line for c in cs] for h, cs in every.items()}
        scripts = {h: batch_script(cs) for h, cs in every.items()}
        run: dict[str, Callable[[], float]] = {
            "pdboot": lambda: time_pdboot(inv),
            "ssh": lambda: time_ssh(tb, scripts),
        }
        if before is not None:
            run["before"] = lambda: time_pdboot(inv, before)
        if tools.get("pyinfra"):
            p_inv, p_deploy = write_pyinfra(tb, scripts, work)
            run["pyinfra"] = lambda: time_pyinfra(str(tools["pyinfra"]), p_inv, p_deploy, n)
        if tools.get("ansible"):
            a_inv, a_pb = write_ansible(tb, cmds, work)
            run["ansible"] = lambda: time_ansible(str(tools["ansible"]), a_inv, a_pb, n)
        print(f"  {n} hosts up; warming every tool once, untimed (load {load()})", flush=True)
        for fn in run.values():  # warm every tool's caches (imports, page cache), untimed
            fn()
        load_before = load()
        times: dict[str, list[float]] = {k: [] for k in run}
        cpu: dict[str, list[float]] = {k: [] for k in run}
        names = list(run)
        for i in range(runs):
            for k in names[i % len(names) :] + names[: i % len(names)]:  # rotating order
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                times[k].append(run[k]())
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[k].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
            row = " ".join(f"{k} {times[k][-1]:.2f}" for k in names)
            print(f"    {n} hosts, run {i + 1}: {row} (load {load()})", flush=True)
        per_host = statistics.mean(len(c) for c in cmds.values())
        print(
            f"  {n} hosts ({'sshd + dockerd, rtx6000x2' if dockerd else 'sshd only, cpu-only'}), "
            f"{per_host:.0f} commands per host, {runs} runs; load average {load_before} before, "
            f"{load()} after"
        )
        # CPU on this machine (the tool's processes: pdboot's, the ssh clients, pyinfra's):
        # what a busy machine makes a tool wait for, whatever the load
        print(
            "  CPU seconds on this machine per run (medians): "
            + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in cpu.items()),
            flush=True,
        )
        return {k: statistics.median(v) for k, v in times.items()}
    finally:
        tb.stop()


def tool_path(arg: str | None, default: Path) -> str | None:
    path = arg if arg is not None else str(default)
    return path if path and Path(path).exists() else None


def bytecode(checkout: Path, compiled: bool) -> None:
    """pdboot's modules compiled (as an installed package has them), or their bytecode
    removed (every run then compiles them where PYTHONDONTWRITEBYTECODE is set)."""
    if compiled:
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(checkout / "pdboot")],
            check=True,
            capture_output=True,
        )
        return
    for d in (checkout / "pdboot").rglob("__pycache__"):
        shutil.rmtree(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="*", default=[2, 8, 32])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dockerd-max", type=int, default=8, help="more hosts: sshd only")
    ap.add_argument("--pyinfra", default=None, help="pyinfra CLI ('' to leave it out)")
    ap.add_argument("--ansible", default="", help="ansible-playbook to compare with (opt-in)")
    ap.add_argument(
        "--before",
        type=Path,
        default=None,
        help="another checkout (e.g. `git archive main pdboot | tar -x -C DIR`): its "
        "`pdboot preflight` timed alongside, as `before`",
    )
    ap.add_argument(
        "--no-bytecode",
        action="store_true",
        help="time pdboot compiling its modules on every run (its __pycache__ removed)",
    )
    args = ap.parse_args()
    for checkout in [ROOT] + ([args.before] if args.before else []):
        bytecode(checkout, not args.no_bytecode)
    print(
        "pdboot's bytecode: "
        + ("none (compiled on every run)" if args.no_bytecode else "compiled (as installed)")
    )
    tools = {
        "pyinfra": tool_path(args.pyinfra, VENV / "pyinfra"),
        "ansible": tool_path(args.ansible, VENV / "ansible-playbook") if args.ansible else None,
    }
    if not tools["pyinfra"] and args.pyinfra != "":
        print(f"(no {args.pyinfra or VENV / 'pyinfra'}: pyinfra left out)")
    s = startup(max(args.runs, 5))
    print(
        f"start-up ({max(args.runs, 5)} runs, medians, load {load()}): `python -m pdboot "
        f"--version` {s['version']:.3f} s, bare `python -c pass` {s['python']:.3f} s; pdboot's "
        f"own share {s['version'] - s['python']:.3f} s ({s['version'] / s['python']:.2f}x)",
        flush=True,
    )
    rows = [(n, bench(n, args.runs, tools, n <= args.dockerd_max, args.before)) for n in args.hosts]
    if not rows:
        return
    shown = [t for t in TOOLS if any(t in med for _, med in rows)]
    ratios = [("pdboot", "pyinfra"), ("pdboot", "ssh"), ("before", "pyinfra"), ("before", "ssh")]
    ratios = [(a, b) for a, b in ratios if a in shown and b in shown]
    print()
    print("| hosts | " + " | ".join(shown + [f"{a} / {b}" for a, b in ratios]) + " |")
    print("| --- " * (len(shown) + len(ratios) + 1) + "|")
    for n, med in rows:
        cells = [f"{med[t]:.2f} s" if t in med else "n/a" for t in shown]
        cells += [f"{med[a] / med[b]:.2f}x" if a in med and b in med else "n/a" for a, b in ratios]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if len(rows) > 1:
        n0, base = rows[0]
        print(f"\nGrowth with the hosts (median time / median at {n0} hosts):")
        print("| hosts | " + " | ".join(shown) + " |")
        print("| --- " * (len(shown) + 1) + "|")
        for n, med in rows:
            cells = [f"{med[t] / base[t]:.2f}x" if t in med and t in base else "n/a" for t in shown]
            print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
