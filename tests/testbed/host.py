"""One test host: a network namespace with its own hostname, mounts, sshd and dockerd.

Layout: an "anchor" process (``sleep infinity``) is started inside the host's network
namespace with a new UTS and mount namespace (``init.sh`` sets the hostname and the per-host
mounts). sshd and dockerd join the anchor's namespaces with nsenter, so each can be stopped
and started again on its own (tests that break things), and every ssh session and every
container started by that dockerd sees the host's own view:

- ``/usr/local/sbin``  -> the host's emulated tools (nvidia-smi, ibv_devinfo, ...)
- ``/dev/infiniband``  -> the host's fake uverbs/rdma_cm character devices (mknod)
- ``/var/lib/pdboot``  -> the host's own folder (compose projects of different hosts
                          would otherwise overwrite each other)
- ``/tmp``, ``/run``   -> private; ``/run/docker.sock`` is the host's own engine
- ``/proc/driver``     -> a tmpfs holding ``nvidia/version`` when the profile has a driver

Whatever of this machine those mounts would hide but a host must see is bind-mounted back at
the same path, read-only: the repository (the emulators and hooks the hosts run live in it;
a test may run pdboot inside a host) and this Python's environment. CI runs a fresh clone that
may well lie under /tmp, which every host has its own of.

Not ``ip netns exec`` for dockerd: it remounts /sys and dockerd then fails (recipe).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.testbed import procs
from tests.testbed.netns import set_link
from tests.testbed.procs import Proc

HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What INIT_SH mounts over: a path of this machine under one of these is not there in a host.
PRIVATE_IN_HOST = (
    "/tmp",
    "/run",
    "/usr/local/sbin",
    "/var/lib/pdboot",
    "/dev/infiniband",
    "/proc/driver",
)
REPO_ROOT = Path(__file__).resolve().parents[2]
# mount points that must exist on the machine for the per-host bind mounts
GLOBAL_MOUNTPOINTS = (Path("/dev/infiniband"), Path("/var/lib/pdboot"))

INIT_SH = r"""set -eu
hostname "$PDT_HOSTNAME"
# Paths the private mounts below would hide but the host must see (shared_paths()): held
# on a mount point of our own now, put back at their own path at the end.
i=0
while IFS= read -r p; do
  mkdir -p "$PDT_DIR/share/$i"
  mount --bind "$p" "$PDT_DIR/share/$i"
  i=$((i+1))
done < "$PDT_DIR/shared"
# Drop this namespace's copies of every netns handle: they would keep other testbeds'
# namespaces (and their veths) alive after those are deleted.
umount -l /run/netns 2>/dev/null || true
mount -t tmpfs -o mode=755,size=64m pdt-run /run
mkdir -p /run/sshd /run/lock
ln -s "$PDT_DIR/docker.sock" /run/docker.sock
if [ -n "$PDT_DISK_MB" ]; then
  # the low-disk knob: the engine's data and /var/lib/pdboot share a small filesystem
  mount -t tmpfs -o "size=${PDT_DISK_MB}m" pdt-disk "$PDT_DIR/disk"
fi
mkdir -p "$PDT_DIR/disk/docker" "$PDT_DIR/disk/varlib"
mount --bind "$PDT_DIR/disk/varlib" /var/lib/pdboot
mount --bind "$PDT_DIR/sbin" /usr/local/sbin
mount --bind "$PDT_DIR/ib" /dev/infiniband
mount --bind "$PDT_DIR/tmp" /tmp
# names of the testbed's hosts resolve on every host (an inventory may use them)
mount --bind "$PDT_DIR/hosts" /etc/hosts
# the machine's root .bashrc (pyenv init) costs ~0.5 s per ssh command; hosts get their own
if [ -f /root/.bashrc ]; then
  mount --bind "$PDT_DIR/bashrc" /root/.bashrc
fi
if [ -d "$PDT_DIR/procdriver" ] && [ -d /proc/driver ]; then
  mount --bind "$PDT_DIR/procdriver" /proc/driver
fi
i=0
while IFS= read -r p; do
  mkdir -p "$p"
  mount --bind "$PDT_DIR/share/$i" "$p"
  mount -o remount,bind,ro "$p"
  umount "$PDT_DIR/share/$i"
  i=$((i+1))
done < "$PDT_DIR/shared"
touch "$PDT_DIR/anchor.ready"
exec sleep infinity
"""


def hidden_in_host(path: str) -> bool:
    """True when a host sees its own folder (or nothing) where this machine has `path`."""
    return any(path.startswith(root + "/") for root in PRIVATE_IN_HOST)


def _candidates() -> list[str]:
    """What a host may need from this machine: the repository (emulators, hooks), the pdboot
    package being tested, this Python's prefixes and import path."""
    cands = [
        str(REPO_ROOT),
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        os.path.dirname(sys.executable),
        *sys.path,
    ]
    spec = importlib.util.find_spec("pdboot")
    if spec and spec.origin:
        cands.append(os.path.dirname(os.path.dirname(spec.origin)))
    return cands


def shared_paths(candidates: list[str] | None = None) -> list[str]:
    """The folders among `candidates` that a host would not see at their path (they lie
    under its private /tmp or /run: a fresh clone in /tmp, a venv there), outermost only.
    Anything else already shows through the host's mount namespace unchanged."""
    cands = _candidates() if candidates is None else candidates
    # a symlinked venv python or prefix: the link's path and its target's both matter
    paths = {q for c in cands if c for q in (os.path.abspath(c), os.path.realpath(c))}
    hidden = sorted(p for p in paths if hidden_in_host(p) and os.path.isdir(p) and "\n" not in p)
    out: list[str] = []
    for p in hidden:  # sorted: a parent comes before what lies under it
        if not any(p.startswith(o + "/") for o in out):
            out.append(p)
    return out


@dataclass
class Host:
    """A started test host. ``address`` is what inventories and ssh use."""

    name: str
    index: int
    address: str
    dir: Path
    netns: str
    veth: str
    registry: str
    profile: dict[str, Any]
    cgroup_parent: str
    procs: dict[str, Proc] = field(default_factory=dict)
    mntns: int | None = None

    # ------------------------------------------------------------------ paths
    @property
    def docker_sock(self) -> Path:
        return self.dir / "docker.sock"

    @property
    def docker_host(self) -> str:
        """DOCKER_HOST for a client on this machine talking to the host's engine directly."""
        return f"unix://{self.docker_sock}"

    @property
    def data_root(self) -> Path:
        return self.dir / "disk" / "docker"

    # ------------------------------------------------------------------ lifecycle
    def _nsenter(self) -> list[str]:
        anchor = self.procs["anchor"]
        return ["nsenter", f"--target={anchor.pid}", "--net", "--uts", "--mount", "--"]

    def start_anchor(self) -> None:
        for sub in ("sbin", "ib", "tmp", "disk"):
            (self.dir / sub).mkdir(exist_ok=True)
        os.chmod(self.dir / "tmp", 0o1777)
        (self.dir / "init.sh").write_text(INIT_SH)
        (self.dir / "bashrc").write_text("# ~/.bashrc of a pdboot test host\n")
        (self.dir / "shared").write_text("".join(p + "\n" for p in shared_paths()))
        env = dict(
            os.environ,
            PDT_HOSTNAME=self.name,
            PDT_DIR=str(self.dir),
            PDT_DISK_MB=str(self.profile.get("disk_mb") or ""),
        )
        argv = [
            "nsenter",
            f"--net=/run/netns/{self.netns}",
            "--",
            "unshare",
            "--uts",
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            str(self.dir / "init.sh"),
        ]
        self.procs["anchor"] = procs.spawn(argv, "anchor", self.dir / "anchor.log", env)

    def wait_anchor(self, deadline: float) -> None:
        ready = self.dir / "anchor.ready"
        while not ready.exists():
            if not procs.alive(self.procs["anchor"]) or time.monotonic() > deadline:
                log = (self.dir / "anchor.log").read_text(errors="replace")
                raise RuntimeError(f"host {self.name}: namespace setup failed:\n{log}")
            time.sleep(0.01)
        self.mntns = procs.ns_inode(self.procs["anchor"].pid, "mnt")

    def start_sshd(self) -> None:
        argv = [*self._nsenter(), "/usr/sbin/sshd", "-D", "-e", "-f", str(self.dir / "sshd_config")]
        self.procs["sshd"] = procs.spawn(argv, "sshd", self.dir / "sshd.log")

    def stop_sshd(self) -> None:
        """Stop the host's sshd (a knob for tests): the port then refuses connections."""
        p = self.procs.pop("sshd", None)
        if p:
            procs.stop(p)

    def cut_link(self) -> None:
        """A knob for tests: the host drops off the network without a reset (its veth
        down on the bridge side); ``restore_link`` plugs it back in."""
        set_link(self.veth, up=False)

    def restore_link(self, wait_s: float = 15.0) -> None:
        """Plugged back in and reachable: a connect right after the veth comes up can still
        fail with "No route to host" (the neighbour entry the cut left FAILED; seen in a
        lock test that connected at once), so this returns when sshd answers again."""
        set_link(self.veth, up=True)
        if wait_s > 0 and "sshd" in self.procs:
            self.wait_sshd(time.monotonic() + wait_s)

    def wait_sshd(self, deadline: float) -> None:
        while True:
            try:
                with socket.create_connection((self.address, 22), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            if not procs.alive(self.procs["sshd"]) or time.monotonic() > deadline:
                log = (self.dir / "sshd.log").read_text(errors="replace")
                raise RuntimeError(f"host {self.name}: sshd did not start:\n{log}")
            time.sleep(0.02)

    def start_dockerd(self) -> None:
        pidfile = self.dir / "dockerd.pid"
        pidfile.unlink(missing_ok=True)  # a stale pidfile stops a restart (recipe)
        argv = [
            *self._nsenter(),
            "dockerd",
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.dir / "x"),
            "--pidfile",
            str(pidfile),
            "-H",
            self.docker_host,
            "--bridge",
            "none",
            "--iptables=false",
            "--ip-masq=false",
            "--insecure-registry",
            self.registry,
            "--cgroup-parent",
            self.cgroup_parent,
            "--storage-driver",
            "overlay2",
            "--log-level",
            "warn",
        ]
        if self.profile.get("container_runtime"):
            argv += ["--add-runtime", "nvidia=/usr/local/sbin/nvidia-container-runtime"]
        # dockerd enables its nvidia device driver only when the hook is on ITS PATH
        env = dict(os.environ, PATH=HOST_PATH)
        env.pop("DOCKER_HOST", None)
        self.procs["dockerd"] = procs.spawn(argv, "dockerd", self.dir / "dockerd.log", env)

    def stop_dockerd(self, timeout: float = 15.0) -> None:
        """Stop the host's engine (a knob for tests); its containers go down with it."""
        p = self.procs.pop("dockerd", None)
        if p:
            procs.stop(p, timeout=timeout)

    def wait_dockerd(self, deadline: float) -> None:
        while True:
            try:
                if self.engine_api("GET", "/_ping", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            if not procs.alive(self.procs["dockerd"]) or time.monotonic() > deadline:
                log = (self.dir / "dockerd.log").read_text(errors="replace")
                raise RuntimeError(f"host {self.name}: dockerd did not start:\n{log[-4000:]}")
            time.sleep(0.05)

    # ------------------------------------------------------------------ helpers for tests
    def engine_api(self, method: str, path: str, timeout: float = 10) -> tuple[int, Any]:
        """One call to the host's Docker Engine API over its unix socket (no SSH)."""
        conn = _UnixHTTPConnection(str(self.docker_sock), timeout)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(body) if body else None
        except ValueError:
            return resp.status, body.decode(errors="replace")

    def docker(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """The docker CLI of this machine against the host's engine (not through SSH)."""
        env = dict(os.environ, DOCKER_HOST=self.docker_host)
        res = subprocess.run(
            ["docker", *args], capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and res.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} on {self.name}: {res.stderr.strip()}")
        return res

    def exec(
        self, argv: list[str] | str, timeout: float = 60, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the host's namespaces as root, without SSH. Its cwd is the
        host's /, so Python there imports pdboot from this checkout through PYTHONPATH (an
        editable install may point at another checkout, one the host cannot see)."""
        if isinstance(argv, str):
            argv = ["/bin/sh", "-c", argv]
        pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, PATH=HOST_PATH, DOCKER_HOST=self.docker_host, PYTHONPATH=pythonpath)
        res = subprocess.run(
            [*self._nsenter(), *argv], capture_output=True, text=True, timeout=timeout, env=env
        )
        if check and res.returncode != 0:
            raise RuntimeError(f"{argv} on {self.name}: rc={res.returncode}: {res.stderr}")
        return res

    def occupy_port(self, port: int, bind: str = "0.0.0.0") -> Proc:
        """Knob: a process listening on `port` in this host (like a leftover server)."""
        code = (
            "import socket,time;s=socket.socket();"
            "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            f"s.bind(({bind!r},{int(port)}));s.listen(16);time.sleep(1e9)"
        )
        argv = [*self._nsenter(), "/usr/bin/python3", "-S", "-c", code]
        p = procs.spawn(argv, f"port{port}", self.dir / f"port{port}.log")
        deadline = time.monotonic() + 10
        while not _listening(self, port):
            if not procs.alive(p) or time.monotonic() > deadline:
                raise RuntimeError(f"host {self.name}: could not occupy port {port}")
            time.sleep(0.02)
        self.procs[f"port{port}"] = p
        return p

    def release_port(self, port: int) -> None:
        p = self.procs.pop(f"port{port}", None)
        if p:
            procs.stop(p)

    def pull(self, image: str) -> None:
        self.docker("pull", "-q", image, timeout=300)

    def shell_line(self) -> str:
        """An `nsenter` line a person can paste to get a shell on this host."""
        return " ".join(shlex.quote(a) for a in [*self._nsenter(), "/bin/bash"])

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "index": self.index,
            "address": self.address,
            "dir": str(self.dir),
            "netns": self.netns,
            "veth": self.veth,
            "cgroup_parent": self.cgroup_parent,
            "mntns": self.mntns,
            "procs": {k: p.to_json() for k, p in self.procs.items()},
        }


def _listening(host: Host, port: int) -> bool:
    try:
        with socket.create_connection((host.address, port), timeout=0.2):
            return True
    except OSError:
        return False


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s
