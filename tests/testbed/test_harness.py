"""Tests of the testbed itself: the hosts are real enough for pdboot's integration tests."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.shared_data import H200_HOST
from tests.testbed import host as host_mod
from tests.testbed import netns, procs
from tests.testbed.harness import HostSpec, Testbed, read_state
from tests.testbed.polling import wait_http_ok

# the in-tree copy of shared/fixtures/h200-host (every checkout has it)
H200_FIXTURES = H200_HOST
CAPTURE_UUID = "GPU-dff3982f-1734-4108-9e3a-3be6c0ad1d14"
VARIANTS_UUID = "GPU-b6cd4b9a-1fdd-da52-8459-7a354e0028c2"  # the second H200 of variants.txt
MakeTestbed = Callable[..., Testbed]


def _capture_blocks(name: str) -> list[tuple[str, str, int]]:
    text = (H200_FIXTURES / name).read_text()
    return [
        (m.group(1), m.group(2), int(m.group(3)))
        for m in re.finditer(r"### \$ (.*?)\n(.*?)### exit=(\d+)\n", text, re.S)
    ]


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = 30) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"} if data else {}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _wait_http(url: str, deadline_s: float = 60) -> None:
    wait_http_ok(url, deadline_s, every=0.1, timeout=2)


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ---------------------------------------------------------------------- SSH and engines


def test_ssh_strict_host_keys(testbed: Testbed, tmp_path: Path) -> None:
    res = testbed.ssh("decode", "hostname; echo $DOCKER_HOST")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[0] == "decode"
    assert res.stdout.split()[1] == testbed.hosts["decode"].docker_host

    # a known_hosts that records another key for that address: refused, not accepted
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "known_hosts"
    pub = other.with_suffix(".pub").read_text().split()
    wrong.write_text(f"{testbed.hosts['decode'].address} {pub[0]} {pub[1]}\n")
    argv = testbed.ssh_argv("decode", "true")
    argv[argv.index(f"UserKnownHostsFile={testbed.known_hosts}")] = f"UserKnownHostsFile={wrong}"
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert res.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr

    # and an empty one: unknown host, refused under StrictHostKeyChecking=yes
    wrong.write_text("")
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert res.returncode == 255
    assert "Host key verification failed" in res.stderr


def test_fabric_reaches_hosts_with_strict_keys(testbed: Testbed) -> None:
    import fabric
    import paramiko

    for name in testbed.hosts:
        client_kwargs = {
            "key_filename": str(testbed.identity_file),
            "look_for_keys": False,
            "allow_agent": False,
        }
        with fabric.Connection(
            testbed.hosts[name].address, user="root", connect_kwargs=client_kwargs
        ) as c:
            c.client.load_host_keys(str(testbed.known_hosts))
            c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
            out = c.run("hostname && docker compose version", hide=True, in_stream=False).stdout
        assert out.splitlines()[0] == name
        assert "Docker Compose version v2" in out


def test_each_host_has_its_own_engine_and_network(testbed_clean: Testbed) -> None:
    tb = testbed_clean
    dec, pre = tb.hosts["decode"], tb.hosts["prefill"]
    tb.ssh("decode", f"docker pull -q {tb.image}", check=True, timeout=120)
    # a server in a network_mode=host container lives in that host's namespace only
    res = tb.ssh(
        "decode",
        f"docker run -d --name probe --network host --entrypoint python3 "
        f"{tb.image} -m http.server 8299 --bind 0.0.0.0",
        check=True,
    )
    cid = res.stdout.strip()
    assert tb.ssh("decode", "docker ps -q --no-trunc").stdout.split() == [cid]
    assert tb.ssh("prefill", "docker ps -aq").stdout.split() == []
    assert pre.engine_api("GET", "/containers/json?all=1")[1] == []
    _wait_http(f"http://{dec.address}:8299/")
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{pre.address}:8299/", timeout=2)
    with pytest.raises(OSError):
        urllib.request.urlopen("http://127.0.0.1:8299/", timeout=2)
    # host names resolve on the hosts; each host has its own /var/lib/pdboot
    assert tb.ssh("decode", "getent hosts prefill").stdout.split() == [pre.address, "prefill"]
    tb.ssh("decode", "echo decode > /var/lib/pdboot/who", check=True)
    assert tb.ssh("prefill", "cat /var/lib/pdboot/who").returncode != 0
    # no route out of the testbed's /24
    probe = "import socket; socket.create_connection(('10.99.0.1', 80), 1)"
    res = tb.ssh("decode", f"python3 -c {shlex.quote(probe)}")
    assert res.returncode != 0 and "unreachable" in res.stderr.lower()


def test_gpu_requests_need_the_container_runtime(make_testbed: MakeTestbed) -> None:
    tb = make_testbed([HostSpec("gpu"), HostSpec("bare", profile="no-container-runtime")])
    for name in tb.hosts:
        tb.hosts[name].pull(tb.image)
    run = f"docker run --rm --gpus all --entrypoint python3 {tb.image} -c 'print(42)'"
    ok = tb.ssh("gpu", run)
    assert ok.returncode == 0 and ok.stdout.strip() == "42", ok.stderr
    # dockerd's nvidia driver tells the container which GPUs it got (the stand-in reads it)
    env = tb.ssh(
        "gpu",
        f"docker run --rm --gpus '\"device=1\"' --entrypoint python3 {tb.image} "
        "-c 'import os; print(os.environ[\"NVIDIA_VISIBLE_DEVICES\"])'",
    )
    assert env.stdout.strip() == "1", env.stderr
    smi = tb.ssh(
        "gpu",
        f"docker run --rm --gpus '\"device=1\"' --entrypoint nvidia-smi {tb.image} "
        "--query-gpu=index,pci.bus_id --format=csv,noheader",
    )
    assert smi.stdout == "0, 00000000:41:00.0\n", smi.stderr  # GPU 1 of the host, seen as 0
    bad = tb.ssh("bare", run)
    assert bad.returncode != 0
    assert 'could not select device driver "" with capabilities: [[gpu]]' in bad.stderr
    info = tb.ssh("gpu", "docker info --format '{{json .Runtimes}}'").stdout
    assert "nvidia" in json.loads(info)
    assert "nvidia" not in json.loads(
        tb.ssh("bare", "docker info --format '{{json .Runtimes}}'").stdout
    )


def test_gpu_containers_hold_memory_the_hosts_nvidia_smi_shows(
    make_testbed: MakeTestbed,
) -> None:
    """EMULATED: a container granted GPU 1 holds --gpu-memory-utilization of its memory for
    as long as its process lives, in the host's nvidia-smi (preflight's gpu.memory_free)."""
    tb = make_testbed([HostSpec("gpu")])
    tb.hosts["gpu"].pull(tb.image)
    apps = "nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits"
    used = "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits"
    assert tb.ssh("gpu", apps).stdout == ""
    cid = tb.ssh(
        "gpu",
        f"docker run -d --gpus '\"device=1\"' --entrypoint python3 {tb.image} "
        "-c 'import time; time.sleep(600)' --gpu-memory-utilization 0.5",
    ).stdout.strip()
    pid = tb.ssh("gpu", f"docker inspect -f '{{{{.State.Pid}}}}' {cid}").stdout.strip()
    uuid1 = tb.ssh("gpu", "nvidia-smi -i 1 --query-gpu=uuid --format=csv,noheader").stdout.strip()
    assert tb.ssh("gpu", apps).stdout == f"{uuid1}, {pid}, {97887 // 2}\n"
    assert tb.ssh("gpu", used).stdout == f"0, 0\n1, {97887 // 2}\n"
    assert cid in tb.ssh("gpu", f"cat /proc/{pid}/cgroup").stdout  # what preflight reads
    tb.ssh("gpu", f"docker rm -f {cid}")
    assert tb.ssh("gpu", apps).stdout == "" and tb.ssh("gpu", used).stdout == "0, 0\n1, 0\n"


def test_knobs_stop_sshd_and_occupy_port(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(
        [HostSpec("a", busy_ports=(8200,), overrides={"disk_mb": 64}), HostSpec("b", sshd=False)],
        images_needed=False,
    )
    df = tb.ssh(
        "a",
        'df -k --output=size /var/lib/pdboot "$(docker info --format '
        "'{{.DockerRootDir}}')\" | tail -n +2",
    ).stdout.split()
    assert [int(x) for x in df] == [65536, 65536]  # the low-disk knob: both on one 64 MiB fs
    out = tb.ssh("a", "python3 -c \"import socket; s=socket.socket(); s.bind(('0.0.0.0', 8200))\"")
    assert out.returncode != 0 and "Address already in use" in out.stderr
    res = tb.ssh("b", "true", timeout=30)
    assert res.returncode == 255 and "Connection refused" in res.stderr
    tb.hosts["a"].stop_dockerd()
    res = tb.ssh("a", "docker ps")
    assert res.returncode != 0 and "Cannot connect to the Docker daemon" in res.stderr


def test_shared_paths_are_what_a_private_tmp_would_hide(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    (clone / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / "site").mkdir()
    (tmp_path / "link").symlink_to(clone)
    got = host_mod.shared_paths(
        [
            str(clone),
            str(clone / ".venv" / "bin"),
            "/tmp",
            "/run",
            str(tmp_path / "site"),
            "/usr/lib",
            str(tmp_path / "gone"),
            str(tmp_path / "link"),
            "",
        ]
    )
    # the host's own /tmp stays its own; what exists under it is shared, outermost only
    assert got == sorted([str(clone), str(tmp_path / "link"), str(tmp_path / "site")])


def test_a_repository_under_tmp_is_seen_by_hosts(
    make_testbed: MakeTestbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI runs a fresh clone that may lie under /tmp, which every host has its own of
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "marker").write_text("from the machine\n")
    (tmp_path / "private").write_text("not shared\n")
    real = host_mod._candidates
    monkeypatch.setattr(host_mod, "_candidates", lambda: [*real(), str(clone)])
    tb = make_testbed([HostSpec("a")], images_needed=False)
    h = tb.hosts["a"]
    assert h.exec(["cat", str(clone / "marker")]).stdout == "from the machine\n"
    res = h.exec(["touch", str(clone / "written")])
    assert res.returncode != 0 and "Read-only" in res.stderr
    assert h.exec(["test", "-e", str(tmp_path / "private")]).returncode == 1
    h.exec("echo host > /tmp/pdt-host-only", check=True)
    assert not Path("/tmp/pdt-host-only").exists()
    # the emulators run from the repository; the Python running these tests runs pdboot there
    smi = tb.ssh("a", "nvidia-smi -L")
    assert smi.returncode == 0 and smi.stdout.startswith("GPU 0: NVIDIA RTX PRO 6000"), smi
    code = "import pdboot; print(pdboot.__file__)"
    res = h.exec([sys.executable, "-c", code])
    assert res.stdout.strip() == str(host_mod.REPO_ROOT / "pdboot" / "__init__.py"), res
    res = h.exec([sys.executable, "-m", "pdboot", "--help"])
    assert res.returncode == 0 and "preflight" in res.stdout, res


def _need_testbed() -> None:
    """As conftest's fixtures: a testbed that cannot start fails under CI=true (never a
    silent skip) and skips elsewhere."""
    from tests.testbed.harness import can_run

    why = can_run()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the testbed cannot start under CI: {why}", pytrace=False)
        pytest.skip(str(why))


# ---------------------------------------------------------------------- emulated hardware


def test_h200_profile_reproduces_the_capture(make_testbed: MakeTestbed) -> None:
    if not H200_FIXTURES.is_dir():  # the repository keeps a copy: missing is a failure
        pytest.fail(f"no h200-host capture in {H200_FIXTURES}", pytrace=False)
    tb = make_testbed([HostSpec("h200", profile="h200")], images_needed=False)
    compared = 0
    for fixture in ("smi.txt", "variants.txt"):
        for cmd, expected, rc in _capture_blocks(fixture):
            if not cmd.startswith("nvidia-smi"):
                continue
            res = tb.ssh("h200", f"{cmd} 2>&1")
            got = res.stdout
            expected = expected.replace(VARIANTS_UUID, CAPTURE_UUID)
            if "temperature.gpu" in cmd:  # the second machine ran 1 degree cooler
                expected = expected.replace(", 36\n", ", 37\n")
            if cmd == "nvidia-smi":  # line 1 is the clock
                assert re.fullmatch(
                    r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}", got.split("\n", 1)[0]
                )
                got, expected = got.split("\n", 1)[1], expected.split("\n", 1)[1]
            assert (res.returncode, got) == (rc, expected), cmd
            compared += 1
    assert compared >= 20
    q = tb.ssh("h200", "nvidia-smi -q").stdout.splitlines()
    expected_q = [
        line
        for line in (H200_FIXTURES / "smiq.txt").read_text().splitlines()
        if not line.startswith("###")
    ]
    assert [line for line in q if "Timestamp" not in line] == [
        line for line in expected_q if "Timestamp" not in line
    ]
    host = tb.ssh(
        "h200",
        "ls /dev/infiniband; cat /proc/driver/nvidia/version; "
        "command -v ibv_devinfo || echo no-ibv",
    ).stdout
    assert host.splitlines()[0] == "rdma_cm"
    assert "580.159.04" in host and host.rstrip().endswith("no-ibv")


PROFILE_CHECKS: dict[str, tuple[str, Callable[[str, int], bool]]] = {
    "rtx6000x2": (
        "nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version "
        "--format=csv,noheader,nounits",
        lambda out, rc: (
            rc == 0
            and out.splitlines()
            == [
                f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 12.0, 580.95.05"
                for i in (0, 1)
            ]
        ),
    ),
    "old-driver": (
        "nvidia-smi --version",
        lambda out, rc: (
            "DRIVER version      : 550.90.07" in out and "CUDA Version        : 12.4" in out
        ),
    ),
    "no-driver": ("nvidia-smi; ls /proc/driver", lambda out, rc: "not found" in out),
    "gpu-busy": (
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory "
        "--format=csv,noheader,nounits",
        lambda out, rc: out == "48213, /usr/bin/python3, 81920\n",
    ),
    "mig": (
        "nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader; nvidia-smi",
        lambda out, rc: out.startswith("0, Enabled\n1, Disabled\n") and "MIG devices:" in out,
    ),
    "rtx6000x2-port-down": (
        "ibv_devinfo; ls /dev/infiniband",
        lambda out, rc: "state:\t\t\tPORT_DOWN (1)" in out and "uverbs0" in out,
    ),
    "rtx6000x2-roce": (
        "ibv_devinfo -d mlx5_0",
        lambda out, rc: "link_layer:\t\tEthernet" in out and "PORT_ACTIVE (4)" in out,
    ),
    "rtx6000x2-no-rdma": (
        "ibv_devinfo; ls -A /dev/infiniband | wc -l",
        lambda out, rc: "not found" in out and out.rstrip().endswith("0"),
    ),
}


def test_profiles_print_their_values(make_testbed: MakeTestbed) -> None:
    specs = [HostSpec(f"h{i}", profile=name) for i, name in enumerate(PROFILE_CHECKS)]
    tb = make_testbed(specs, images_needed=False)
    for spec, (name, (cmd, ok)) in zip(specs, PROFILE_CHECKS.items(), strict=True):
        res = tb.ssh(spec.name, f"{{ {cmd}; }} 2>&1")
        assert ok(res.stdout, res.returncode), f"{name}: {cmd}\n{res.stdout}"
    bad = tb.ssh("h0", "nvidia-smi --query-gpu=index,not_a_field --format=csv")
    assert (bad.returncode, bad.stdout) == (
        2,
        'Field "not_a_field" is not a valid field to query.\n\n',
    )
    assert tb.ssh("h0", "nvidia-smi -i 5 --query-gpu=index --format=csv").returncode == 6


# ---------------------------------------------------------------------- engine stand-in + router


def _engine(tb: Testbed, host: str, name: str, args: str, env: dict[str, str]) -> str:
    envs = " ".join(f"-e {k}={shlex.quote(v)}" for k, v in env.items())
    cmd = (
        f"docker run -d --name {name} --network host --ulimit memlock=8388608 "
        f"--ulimit nofile=20000 {envs} {tb.image} Qwen/Qwen3-0.6B {args}"
    )
    return tb.ssh(host, cmd, check=True, timeout=120).stdout.strip()


def test_standin_refuses_a_bad_kv_transfer_config(testbed_clean: Testbed) -> None:
    tb = testbed_clean
    tb.ssh("decode", f"docker pull -q {tb.image}", check=True, timeout=120)
    bad = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_rank": 1})
    _engine(tb, "decode", "bad", f"--kv-transfer-config {shlex.quote(bad)}", {})
    rc = tb.ssh("decode", "docker wait bad", check=True, timeout=60).stdout.strip()
    assert rc != "0"
    logs = tb.ssh("decode", "docker logs bad 2>&1").stdout
    assert "Unexpected keyword argument" in logs and "kv_rank" in logs


def test_pd_request_through_the_real_router(testbed_clean: Testbed) -> None:
    tb = testbed_clean
    dec, pre, ing = (tb.hosts[n] for n in ("decode", "prefill", "ingress"))
    for h in (dec, pre):
        h.pull(tb.image)
    ing.pull(tb.router_image)

    def kv(role):
        return shlex.quote(
            json.dumps(
                {
                    "kv_connector": "NixlConnector",
                    "kv_role": role,
                }
            )
        )

    _engine(
        tb,
        "decode",
        "decode",
        f"--port 8201 --kv-transfer-config {kv('kv_consumer')}",
        {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": dec.address,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601",
            "STANDIN_LOAD_SECONDS": "0.2",
        },
    )
    _engine(
        tb,
        "prefill",
        "prefill",
        f"--port 8200 --kv-transfer-config {kv('kv_producer')}",
        {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": pre.address,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
            "STANDIN_LOAD_SECONDS": "0.2",
        },
    )
    router = (
        f"docker run -d --name router --network host {tb.router_image} vllm-router "
        f"--vllm-pd-disaggregation --prefill http://{pre.address}:8200 "
        f"--decode http://{dec.address}:8201 --prefill-policy round_robin "
        f"--decode-policy round_robin --host 0.0.0.0 --port 8000 "
        f"--request-timeout-secs 60"
    )
    tb.ssh("ingress", router, check=True)
    _wait_http(f"http://{dec.address}:8201/health")
    _wait_http(f"http://{pre.address}:8200/health")
    _wait_http(f"http://{ing.address}:8000/health")
    chat = {
        "model": "Qwen/Qwen3-0.6B",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "Hello from the testbed"}],
    }
    status, body = _http(f"http://{ing.address}:8000/v1/chat/completions", chat)
    assert status == 200, body + tb.ssh("ingress", "docker logs router 2>&1").stdout[-3000:]
    assert json.loads(body)["choices"][0]["message"]["content"]
    d_metrics = _http(f"http://{dec.address}:8201/metrics")[1]
    p_metrics = _http(f"http://{pre.address}:8200/metrics")[1]
    assert _metric(p_metrics, "standin_remote_prefills_served_total") == 1
    assert _metric(d_metrics, "vllm:nixl_xfer_time_seconds_count") == 1
    assert _metric(d_metrics, "standin_local_prefills_total") == 0

    # the same request fails when the prefill advertises localhost as its side channel
    tb.ssh("prefill", "docker rm -f prefill", check=True)
    _engine(
        tb,
        "prefill",
        "prefill",
        f"--port 8200 --kv-transfer-config {kv('kv_producer')}",
        {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "localhost",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
            "STANDIN_LOAD_SECONDS": "0.2",
        },
    )
    _wait_http(f"http://{pre.address}:8200/health")
    status, body = _http(f"http://{ing.address}:8000/v1/chat/completions", chat)
    assert status >= 500, body
    d_metrics = _http(f"http://{dec.address}:8201/metrics")[1]
    assert _metric(d_metrics, "vllm:nixl_num_failed_transfers_total") >= 1
    assert _metric(d_metrics, "vllm:nixl_xfer_time_seconds_count") == 1
    logs = tb.ssh("decode", "docker logs decode 2>&1").stdout
    assert "Resource temporarily unavailable" in logs and "localhost" in logs


# ---------------------------------------------------------------------- lifecycle


def test_teardown_leaves_nothing(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(["a", "b"])
    tb.hosts["a"].pull(tb.image)
    tb.ssh(
        "a",
        f"docker run -d --network host --entrypoint python3 {tb.image} "
        "-c 'import time; time.sleep(600)'",
        check=True,
    )
    state = read_state(tb.dir)
    assert state is not None
    pids = [procs.Proc.from_json(p) for h in state["hosts"].values() for p in h["procs"].values()]
    net = {netns.netns_inode(h.netns) for h in tb.hosts.values()}
    in_ns = procs.pids_in_namespaces({i for i in net if i}, set())
    assert len(in_ns) >= 4  # sshd, dockerd, containerd, the container at least
    tb.stop()
    assert not any(procs.alive(p) for p in pids + in_ns)
    assert not netns.link_exists(tb.bridge)
    assert not any((netns.NETNS_DIR / h.netns).exists() for h in tb.hosts.values())
    assert not tb.dir.exists()
    assert not list(Path("/sys/fs/cgroup/pids").glob(f"pdt{tb.k}-*"))


def test_a_pinned_mount_namespace_keeps_its_number() -> None:
    """Teardown holds the hosts' mount namespaces open while it sweeps (harness._teardown): a
    namespace whose last process is gone lives on while pinned, and no new namespace gets its
    number, so the sweep's second look cannot hit another testbed's fresh host."""
    _need_testbed()

    def in_new_mount_ns() -> tuple[subprocess.Popen[bytes], procs.Proc, int]:
        child = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
        deadline = time.monotonic() + 10
        host_ns = procs.ns_inode(os.getpid(), "mnt")
        while (ino := procs.ns_inode(child.pid, "mnt")) in (None, host_ns):
            assert time.monotonic() < deadline, "unshare did not start"
            time.sleep(0.01)
        st = procs.start_time(child.pid)
        assert st is not None and ino is not None
        return child, procs.Proc(child.pid, st, "ns"), ino

    first, proc, number = in_new_mount_ns()
    assert procs.pin_ns(proc, "mnt", number + 1) is None  # not that namespace: no pin
    fd = procs.pin_ns(proc, "mnt", number)
    assert fd is not None
    try:
        first.kill()
        first.wait(timeout=10)
        assert not procs.alive(proc)
        assert os.fstat(fd).st_ino == number  # alive with no process in it
        later = [in_new_mount_ns() for _ in range(5)]
        for child, _, _ in later:
            child.kill()
            child.wait(timeout=10)
        assert number not in {ino for _, _, ino in later}, (number, later)
    finally:
        os.close(fd)


def test_orphaned_testbed_is_swept(tmp_path: Path) -> None:
    """A harness killed with SIGKILL leaves its testbed; the next start removes it."""
    _need_testbed()
    code = (
        "from tests.testbed.harness import Testbed; import os; "
        "tb = Testbed.start(['x'], images_needed=False); print(tb.dir, flush=True); "
        "os.kill(os.getpid(), 9)"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    orphan = Path(res.stdout.strip())
    assert orphan.is_dir(), res.stderr
    state = read_state(orphan)
    assert state is not None
    from tests.testbed.harness import sweep_stale

    assert int(state["k"]) in sweep_stale()
    assert not orphan.exists()
    assert not netns.link_exists(state["bridge"])


def test_sigterm_tears_the_testbed_down() -> None:
    _need_testbed()
    code = (
        "from tests.testbed.harness import Testbed; import time; "
        "tb = Testbed.start(['x', 'y'], images_needed=False); print(tb.dir, flush=True); "
        "time.sleep(120)"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    tb_dir = Path(child.stdout.readline().strip())
    state = read_state(tb_dir)
    assert state is not None
    child.terminate()
    assert child.wait(timeout=60) != 0
    assert not tb_dir.exists()
    assert not netns.link_exists(state["bridge"])
    assert not any(
        procs.alive(procs.Proc.from_json(p))
        for h in state["hosts"].values()
        for p in h["procs"].values()
    )


def test_inventory_points_at_the_testbed(testbed: Testbed, tmp_path: Path) -> None:
    from pdboot.inventory.load import load_inventory

    path = testbed.inventory(tmp_path / "inv.yaml")
    inv = load_inventory(path)
    assert inv.hosts["decode"].address == testbed.hosts["decode"].address
    assert inv.decode.hosts == ["decode"] and inv.prefill.hosts == ["prefill"]
    assert inv.router.host == "ingress"
    assert inv.image == testbed.image and inv.router_image == testbed.router_image
    assert inv.container.ulimits.memlock == 8388608 and inv.container.ulimits.nofile == 20000
    assert inv.ssh.known_hosts == str(testbed.known_hosts)
    raw = yaml.safe_load(path.read_text())
    assert raw["model"] == "Qwen/Qwen3-0.6B"


def test_knob_cut_link_silences_a_host_without_a_reset(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(["a"], images_needed=False)
    h = tb.hosts["a"]
    live = socket.create_connection((h.address, 22), timeout=5)
    try:
        banner = b""
        while not banner.endswith(b"\n"):
            banner += live.recv(1)
        assert banner.startswith(b"SSH-")
        h.cut_link()
        assert not netns.link_up(h.veth)
        live.settimeout(3)
        live.sendall(b"SSH-2.0-probe\r\n")
        t0 = time.monotonic()
        with pytest.raises(socket.timeout):  # silence: no reset, no answer
            live.recv(100)
        assert time.monotonic() - t0 >= 2.5
        with pytest.raises(OSError):  # a new connection gets nowhere either
            socket.create_connection((h.address, 22), timeout=3).close()
    finally:
        live.close()
        h.restore_link()
    assert netns.link_up(h.veth)
    assert tb.ssh("a", "echo back", timeout=30).stdout.strip() == "back"
