"""A real Slurm (Debian 12: slurmctld, slurmd, munge; Slurm 22.05) on testbed hosts.

Each host is a node: its UTS namespace gives it its own hostname, which is the node name
slurmd registers as, and its network namespace its own ports 6817/6818; NodeAddr is the
host's address. (Debian's slurmd also takes ``-N NAME`` and ran as that node in a try; several
slurmd sharing one network namespace would need a multiple-slurmd build for their ports.) Every host runs its own munged (its ``/run`` is private, so each has its own
socket) with the machine's one key (``/etc/munge/munge.key``, shared like all of ``/etc``
but ``/etc/hosts``). The controller runs on the first host. No cgroups: proctrack/linuxproc
and task/none. The daemons are the host's processes (``host.procs``): the testbed's
teardown kills them with everything else.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tests.testbed import procs
from tests.testbed.host import HOST_PATH

if TYPE_CHECKING:
    from tests.testbed.harness import Testbed
    from tests.testbed.host import Host

BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "scancel", "squeue", "scontrol")
MUNGE_KEY = Path("/etc/munge/munge.key")


class SlurmError(RuntimeError):
    pass


def missing() -> list[str]:
    """What this machine lacks to run the cluster (empty: nothing)."""
    found = [b for b in BINARIES if _which(b)]
    out = [b for b in BINARIES if b not in found]
    if not MUNGE_KEY.exists():
        out.append(str(MUNGE_KEY))
    return out


def _which(name: str) -> bool:
    return any(
        os.access(os.path.join(d, name), os.X_OK)
        for d in (HOST_PATH + ":/usr/sbin:/usr/bin").split(":")
    )


def _conf(tb: Testbed, hosts: list[Host], state: Path) -> str:
    ctl = hosts[0]
    nodes = "\n".join(
        f"NodeName={h.name} NodeAddr={h.address} CPUs=1 RealMemory=100{_gres(h)} State=UNKNOWN"
        for h in hosts
    )
    return f"""ClusterName=pdt
GresTypes=gpu
SlurmctldHost={ctl.name}({ctl.address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation={state}/ctld
SlurmdSpoolDir=/tmp/slurmd
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile=/tmp/slurmd.pid
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=10
MessageTimeout=20
SlurmctldTimeout=30
SlurmdTimeout=60
{nodes}
PartitionName=pdt Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


# The hosts' GPUs are emulated (no /dev/nvidiaN): slurmd 22.05 drops a count-only gpu GRES
# (`slurmd -G` lists nothing) and wants a character device per GPU, so distinct harmless ones
# stand in. task/none: nothing is constrained to them; Docker picks the engines' GPUs.
GPU_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


def _gpus(h: Host) -> int:
    return len(h.profile.get("gpus") or [])


def _files(h: Host) -> str:
    return ",".join(GPU_FILES[: _gpus(h)])


def _gres(h: Host) -> str:
    """The host's emulated GPUs as a count-only GRES (no device files to bind)."""
    return f" Gres=gpu:{min(_gpus(h), len(GPU_FILES))}" if _gpus(h) else ""


class SlurmCluster:
    def __init__(self, tb: Testbed, hosts: list[str] | None = None) -> None:
        self.tb = tb
        self.hosts = [tb.hosts[h] for h in (hosts or list(tb.hosts))]
        self.dir = tb.dir / "slurm"
        self.conf = self.dir / "slurm.conf"

    @property
    def controller(self) -> Host:
        return self.hosts[0]

    def env(self) -> dict[str, str]:
        """What a Slurm command or daemon gets: this cluster's config; no DOCKER_HOST (sbatch
        would pass it to every step, pointing each node's docker at one host's engine)."""
        env = dict(os.environ, PATH=HOST_PATH + ":/usr/sbin:/usr/bin", SLURM_CONF=str(self.conf))
        env.pop("DOCKER_HOST", None)
        return env

    def start(self, timeout: float = 60) -> None:
        (self.dir / "ctld").mkdir(parents=True, exist_ok=True)
        self.conf.write_text(_conf(self.tb, self.hosts, self.dir))
        (self.dir / "gres.conf").write_text(
            "AutoDetect=off\n"
            + "".join(
                f"NodeName={h.name} Name=gpu File={_files(h)}\n" for h in self.hosts if _gpus(h)
            )
        )
        for h in self.hosts:
            h.exec("mkdir -p /run/munge /tmp/slurmd && chmod 0755 /run/munge", check=True)
            self._spawn(
                h,
                "munged",
                [
                    "munged",
                    "-F",
                    "--force",
                    f"--key-file={MUNGE_KEY}",
                    f"--seed-file={h.dir}/munged.seed",
                    f"--log-file={h.dir}/munged.log",
                    "--pid-file=/run/munge/munged.pid",
                ],
            )
        deadline = time.monotonic() + timeout
        for h in self.hosts:
            self._wait(h, "test -S /run/munge/munge.socket.2", deadline, "munged")
        self._spawn(self.controller, "slurmctld", ["slurmctld", "-D", "-i"])
        self._wait(self.controller, "scontrol ping | grep -q UP", deadline, "slurmctld")
        for h in self.hosts:
            self._spawn(h, "slurmd", ["slurmd", "-D", "-L", f"{h.dir}/slurmd.log"])
        names = ",".join(h.name for h in self.hosts)
        want = f"sinfo -h -N -n {names} -o %T | grep -vq '^idle$' && exit 1 || exit 0"
        self._wait(self.controller, f"sinfo -h -N -o %T | grep -q . && {want}", deadline, "nodes")
        self.tb.save()

    def _spawn(self, h: Host, label: str, argv: list[str]) -> None:
        p = procs.spawn([*h._nsenter(), *argv], label, h.dir / f"{label}.out", self.env())
        h.procs[label] = p

    def _wait(self, h: Host, check: str, deadline: float, what: str) -> None:
        while self.run(h, check).returncode != 0:
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text(errors="replace")[-2000:] for p in self._logs()}
                raise SlurmError(f"{what} did not come up on {h.name}: {logs}")
            time.sleep(0.3)

    def _logs(self) -> list[Path]:
        return [
            p
            for h in self.hosts
            for p in (h.dir / "munged.log", h.dir / "slurmd.log", h.dir / "slurmctld.out")
            if p.exists()
        ]

    def run(
        self, h: Host | None, command: str, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """A shell command on a host (the controller by default), with Slurm's environment."""
        h = h or self.controller
        return subprocess.run(
            [*h._nsenter(), "/bin/sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
            cwd="/",
        )

    # ------------------------------------------------------------------ for tests
    def stop(self) -> None:
        """Stop this cluster's daemons (a shared testbed keeps its hosts)."""
        for h in self.hosts:
            for label in ("slurmd", "slurmctld", "munged"):
                p = h.procs.pop(label, None)
                if p is not None:
                    procs.stop(p)
        self.tb.save()

    def submit(self, script: Path) -> str:
        """sbatch from the script's folder (the job's submit dir): the job id."""
        res = self.run(None, f"cd {script.parent} && sbatch --parsable {script.name}")
        if res.returncode != 0:
            raise SlurmError(f"sbatch {script}: {res.stderr.strip()}")
        return res.stdout.strip().split(";")[0]

    def containers(self, job: str) -> dict[str, list[str]]:
        """host -> ids of the containers the job's steps started there."""
        return {
            h.name: h.docker(
                "ps", "-aq", "--filter", f"label=io.pdboot.slurm-job={job}"
            ).stdout.split()
            for h in self.hosts
        }

    def leftovers(self, job: str) -> list[str]:
        """Processes of the job still running (step shells, step daemons, docker clients);
        an exited slurmstepd may stay a zombie until its namespace's anchor reaps it: not
        running, so not counted. Only this cluster's: test hosts share the machine's PID
        namespace, and another test's cluster numbers its jobs from 1 too (CI once read the
        real-engine Slurm test's running `slurmstepd: [1.batch]` as this job's), so a
        process counts only in the network namespace of one of this cluster's hosts."""
        ours = {os.stat(f"/run/netns/{h.netns}").st_ino for h in self.hosts}
        ps = self.run(None, "ps -eo pid=,stat=,args=").stdout.splitlines()
        return [
            ln
            for ln in ps
            if ln.split()[1][0] != "Z"
            and any(w in ln for w in ("pdboot-step", "slurmstepd", f"slurm-job={job}"))
            and procs.ns_inode(ln.split()[0], "net") in ours
        ]

    @staticmethod
    def roles(batch_log: Path) -> dict[str, tuple[str, str]]:
        """inventory host -> (node, address) as the batch script logged them: the allocation's
        nodes play the hosts in `scontrol show hostnames` order, which sorts them by name."""
        found = re.findall(r"pdboot: host (\S+) is node (\S+) \((\S+)\)", batch_log.read_text())
        return {host: (node, addr) for host, node, addr in found}
