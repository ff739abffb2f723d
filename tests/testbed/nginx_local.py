"""pdboot's proxy files (plan/proxy.py `proxy_files`) run by the real nginx binary of this
machine, outside a container: the files written to one directory, and only what a container
gave them moved (the in-container paths /etc/pdboot-proxy and /tmp to that directory, the
listen address to loopback). Every directive, header check, map and location is the
rendered text's own.

Used by tests/unit/plan/test_proxy_nginx.py (`nginx -t` on the rendered files) and
tests/testbed/standin/test_proxy_edge.py (the corpus through nginx and the real router).
Without an nginx binary a test skips with the reason, except under CI=true, where it fails
(.ci/setup installs Debian's nginx)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from pdboot.plan.model import PROXY_AUTH_FILE, PROXY_CONF_FILE, PROXY_TLS_CERT, PROXY_TLS_KEY
from pdboot.plan.proxy import (
    PROXY_AUTH_IN_CONTAINER,
    PROXY_CERT_IN_CONTAINER,
    PROXY_KEY_IN_CONTAINER,
    PROXY_PID,
    ROUTE_GLOB,
)

DEADLINE = 30.0  # generous bound for "it came up"; nothing asserts on durations
IN_CONTAINER = {
    PROXY_AUTH_FILE: PROXY_AUTH_IN_CONTAINER,
    PROXY_TLS_CERT: PROXY_CERT_IN_CONTAINER,
    PROXY_TLS_KEY: PROXY_KEY_IN_CONTAINER,
}


def nginx_binary() -> str:
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("nginx is not installed (.ci/setup installs Debian's nginx)")
        pytest.skip("nginx is not installed (apt-get install nginx, as .ci/setup does)")
    return found


def localize(files: dict[str, str], where: Path) -> Path:
    """Write ``proxy_files``'s output under ``where`` with the container's paths moved
    there; the conf's path."""
    where.mkdir(parents=True, exist_ok=True)
    conf = files[PROXY_CONF_FILE]
    for name, text in files.items():
        if name == PROXY_CONF_FILE:
            continue
        path = where / name
        path.write_text(text)
        path.chmod(0o600)
        conf = conf.replace(IN_CONTAINER[name], str(path))
    conf = conf.replace(PROXY_PID, str(where / "nginx.pid"))
    conf = conf.replace(ROUTE_GLOB, str(where / "route*.conf"))
    conf = re.sub(r"/tmp/nginx-(\w+)", lambda m: str(where / f"tmp-{m[1]}"), conf)
    conf = re.sub(r"^(\s*listen )(\d+)", r"\g<1>127.0.0.1:\2", conf, flags=re.M)
    if os.geteuid() == 0:  # workers as root, like the container's: the temp dirs are ours
        conf = "user root;\n" + conf
    path = where / PROXY_CONF_FILE
    path.write_text(conf)
    return path


def nginx_test(conf: Path) -> subprocess.CompletedProcess[str]:
    """``nginx -t`` on the file: its exit status and words."""
    return subprocess.run(
        [nginx_binary(), "-t", "-q", "-e", "stderr", "-p", str(conf.parent), "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )


class NginxProc:
    """nginx in the foreground (the conf says `daemon off`) on the localized conf, up once
    its port accepts a connection."""

    def __init__(self, conf: Path, port: int) -> None:
        self.log = conf.parent / "nginx.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [nginx_binary(), "-e", "stderr", "-p", str(conf.parent), "-c", str(conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        end = time.monotonic() + DEADLINE
        while True:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                assert time.monotonic() < end, self.log.read_text()
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
