"""Issue 12 end to end: a deployment with an API key (real CLI, sshd, dockerd, Compose and
vllm-router; stand-in engines that check VLLM_API_KEY like vLLM), the purge marker, and the
ProxyCommand address refused before anything reaches ssh."""

from __future__ import annotations

import itertools
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli, output
from tests.testbed.inventory import write_inventory

ROOT = Path(__file__).resolve().parents[2]
KEY = "pdk-e2e-Api-Key-0123-abcdef"  # fake, hunted for in every output
KEY_ENV = "PDBOOT_E2E_API_KEY"


@pytest.fixture(scope="module")
def cli(cli: Cli) -> Cli:
    return cli.with_(
        env={KEY_ENV: KEY, "PDBOOT_E2E_STREAM_GAP": "0.31"},
        skip_preflight=True,  # preflight has its own e2e tests
    )


def request(url: str, body: bytes | None, key: str | None, method: str) -> int:
    """The status; 0 when nothing answered."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def get(url: str, key: str | None = None) -> int:
    return request(url, None, key, "GET")


def post(url: str, body: bytes, key: str | None = None) -> int:
    return request(url, body, key, "POST")


def router_workers(tb: Any) -> list[dict[str, Any]]:
    """GET /workers on the router's loopback port, from inside the router host."""
    code = (
        "import json, urllib.request; "
        "print(urllib.request.urlopen('http://127.0.0.1:8081/workers', timeout=10).read().decode())"
    )
    res = tb.hosts["ingress"].exec([sys.executable, "-c", code])
    assert res.returncode == 0, res.stderr
    workers = json.loads(res.stdout)["workers"]
    return sorted(
        ({"url": w["url"], "worker_type": w["worker_type"]} for w in workers),
        key=lambda w: w["url"],
    )


def inventory(tb: Any, path: Path, name: str) -> Path:
    overrides = {
        "prefill": {"env": {"STANDIN_LOAD_SECONDS": "0.5"}},
        # --revision only makes the stand-in print the key in its log, for `pdboot logs`
        "decode": {"env": {"STANDIN_LOAD_SECONDS": "0.5"}, "extra_args": ["--revision", KEY]},
        # a streamed token every 0.31 s (the stand-in's knob; its name reads as a secret to
        # the inventory's check, so it travels in secrets.env): the proxy must pass each on
        "secrets": {"api_key": f"env:{KEY_ENV}",
                    "env": {"STANDIN_TOKEN_SECONDS": "env:PDBOOT_E2E_STREAM_GAP"}},
        "timeouts": {"ready_seconds": 60},
    }  # fmt: skip
    return write_inventory(tb, path, name=name, overrides=overrides)


@pytest.mark.slow
def test_api_key_protects_the_engines_and_stays_secret(
    cli: Cli, testbed_clean: Any, tmp_path: Path
) -> None:
    tb = testbed_clean
    inv = inventory(tb, tmp_path / "inv.yaml", "e2ekey")
    up = cli("up", str(inv))
    assert up.returncode == 0, output(up)
    # the test completion went through the router, which gave the engines OPENAI_API_KEY
    assert "decode pulled the KV cache from a prefill engine" in output(up)

    decode = f"http://{tb.hosts['decode'].address}:8201"
    prefill = f"http://{tb.hosts['prefill'].address}:8200"
    for engine in (decode, prefill):
        assert get(f"{engine}/v1/models") == 401
        assert get(f"{engine}/v1/models", "wrong") == 401
        assert get(f"{engine}/v1/models", KEY) == 200
        assert get(f"{engine}/health") == 200  # outside /v1: open, as in vLLM
    # the public endpoint is the proxy (nginx): it checks the key, the router never sees
    # a request without it (vllm-router 0.1.17 checks none itself)
    endpoint = f"http://{tb.hosts['ingress'].address}:8000"
    body = json.dumps(
        {"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 2}
    ).encode()  # fmt: skip
    assert post(f"{endpoint}/v1/chat/completions", body) == 401
    assert post(f"{endpoint}/v1/chat/completions", body, "wrong") == 401
    assert post(f"{endpoint}/v1/chat/completions", body, KEY) == 200
    assert get(f"{endpoint}/v1/models") == 401 and get(f"{endpoint}/v1/models", KEY) == 200
    assert get(f"{endpoint}/health") == 200  # load balancers probe it without a key
    # live workers with a key (rules.live_workers): both engines registered at runtime
    before = router_workers(tb)
    assert sorted(w["worker_type"] for w in before) == ["decode", "prefill"], before
    # the worker API from a client that is not the router host (this machine), even with
    # the key: 404, and nothing changes
    outsider = json.dumps({"url": "http://10.77.250.9:9", "worker_type": "decode"}).encode()
    for key in (None, KEY):
        assert post(f"{endpoint}/workers", outsider, key) == 404
        assert post(f"{endpoint}/add_worker?url=http://10.77.250.9:9", b"", key) == 404
        assert post(f"{endpoint}/remove_worker?url={decode}", b"", key) == 404
        quoted = urllib.parse.quote(decode, safe="")  # an encoded target: refused at the edge
        assert request(f"{endpoint}/workers/{quoted}", None, key, "DELETE") == 400
        assert get(f"{endpoint}/workers", key) == 404
    assert router_workers(tb) == before
    assert post(f"{endpoint}/v1/chat/completions", body, KEY) == 200
    # nor does the router listen anywhere but its host's loopback
    assert get(f"http://{tb.hosts['ingress'].address}:8081/workers") == 0
    # SSE through the proxy and the router: each token arrives as the engine sends it
    # (nginx buffering would hand them over together at the end)
    streamed = json.dumps(
        {"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 6, "stream": True}
    ).encode()  # fmt: skip
    req = urllib.request.Request(
        f"{endpoint}/v1/chat/completions",
        data=streamed,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    arrivals = []
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            if line.startswith(b"data: {") and b'"content": "' in line:
                arrivals.append(time.monotonic())
    assert len(arrivals) >= 6, arrivals
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert sum(g > 0.15 for g in gaps) >= 4, gaps  # apart, not one burst
    # the proxy logged the clients' addresses
    logs = tb.hosts["ingress"].docker("logs", "pdboot-e2ekey-proxy").stdout
    assert '"POST /workers HTTP/1.1" 404' in logs and '"POST /v1/chat/completions' in logs

    # the key: only in secrets.env and the proxy's key check (0600), never in compose, argv,
    # outputs or logs
    auth = "stat -c '%a' /var/lib/pdboot/e2ekey/proxy-auth.conf"
    assert tb.hosts["ingress"].exec(auth).stdout.split() == ["600"]
    assert KEY not in tb.hosts["ingress"].exec("cat /var/lib/pdboot/e2ekey/proxy-nginx.conf").stdout
    # the engines read secrets.env; the router, alone on ingress, its own file with the key
    # alone: no secrets.env there at all
    for h, name in (("prefill", "secrets.env"), ("ingress", "router-secrets.env")):
        host = tb.hosts[h]
        modes = host.exec(f"stat -c '%a' /var/lib/pdboot/e2ekey/{name}").stdout.split()
        assert modes == ["600"], h
        assert KEY not in host.exec("cat /var/lib/pdboot/e2ekey/compose.yaml").stdout
        ps = host.exec("ps -eo args").stdout.splitlines()
        # (the testbed's hosts share one pid namespace: the decode's --revision is ours)
        assert [line for line in ps if KEY in line and "--revision" not in line] == []
        assert "OPENAI_API_KEY" in host.exec(f"cat /var/lib/pdboot/e2ekey/{name}").stdout
    router_env = tb.hosts["ingress"].exec("cat /var/lib/pdboot/e2ekey/router-secrets.env").stdout
    assert router_env.splitlines() == [f"OPENAI_API_KEY={KEY}"]
    assert tb.hosts["ingress"].exec("test -e /var/lib/pdboot/e2ekey/secrets.env").returncode == 1
    # every container without new privileges; the router and the proxy without capabilities
    # beyond what they use (plan/privileges.py), and still serving (above)
    fmt = "{{.Name}} {{.HostConfig.SecurityOpt}} {{.HostConfig.CapDrop}} {{.HostConfig.CapAdd}}"
    for h in ("prefill", "decode", "ingress"):
        ids = tb.hosts[h].docker("ps", "-q", "--filter", "label=io.pdboot.deployment=e2ekey")
        seen = tb.hosts[h].docker("inspect", "--format", fmt, *ids.stdout.split()).stdout
        for line in seen.splitlines():
            assert "no-new-privileges:true" in line, line
            if "-router " in line:
                assert "[ALL] []" in line, line
            if "-proxy " in line:
                assert "[ALL] [CAP_CHOWN CAP_DAC_OVERRIDE CAP_SETGID CAP_SETUID]" in line, line
    lg = cli("logs", str(inv), "decode", "--tail", "200")
    assert lg.returncode == 0, output(lg)
    assert KEY not in output(lg) and "***" in output(lg)  # the stand-in printed it; masked
    st = cli("status", str(inv))
    for res in (up, st):
        assert KEY not in output(res)

    # purge removes the project dir pdboot marked, and refuses a foreign one
    marker = tb.hosts["decode"].exec("cat /var/lib/pdboot/e2ekey/.pdboot-deployment").stdout
    assert marker == "e2ekey\n"
    down = cli("down", str(inv), "--purge")
    assert down.returncode == 0, output(down)
    assert tb.hosts["decode"].exec("test -e /var/lib/pdboot/e2ekey").returncode == 1


def test_proxycommand_address_is_refused_before_ssh(cli: Cli, tmp_path: Path) -> None:
    """The review's case: with `ProxyCommand sh -c "... %h ..."` in ~/.ssh/config, the address
    `i-0abc;touch${IFS}PWNED;#` ran touch on the operator's machine. Now it is refused at load
    time (exit 2, file:line) and nothing runs. No testbed needed: nothing may connect."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text('Host *\n  ProxyCommand sh -c "nc %h %p"\n')
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "name: demo\nmodel: m\nhosts:\n"
        "  a: {address: 'i-0abc;touch${IFS}PWNED;#'}\n"
        "prefill: {hosts: [a], gpus: [0]}\ndecode: {hosts: [a], gpus: [1]}\nrouter: {host: a}\n"
    )
    for cmd in ("preflight", "up", "status", "down", "render"):
        res = cli(cmd, str(inv), env={"HOME": str(home)})
        assert res.returncode == 2, output(res)
        assert f"{inv}:4: hosts.a.address:" in output(res)
    assert not list(tmp_path.rglob("PWNED")) and not (ROOT / "PWNED").exists()
