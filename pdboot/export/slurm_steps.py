"""The job steps of `pdboot export slurm` (pure): each service's container as a `docker run`
or as pyxis's `srun --container-*` options, with the words the batch script expands on the
node (an address, the job id, the secrets path) kept unquoted. slurm.py lays them out.

Under pyxis every step passes ``--no-container-entrypoint`` (as srt-slurm does): sites whose
pyxis runs image entrypoints would otherwise put vLLM's (``vllm serve``) in front of the
command, so the command names its program itself (``vllm serve``, ``vllm-router``, nginx).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pdboot.export.common import SIDE_CHANNEL_HOST
from pdboot.export.edge import PROXY_DIR_IN_CONTAINER
from pdboot.export.weights import WeightsStep
from pdboot.plan.model import HF_CACHE_IN_CONTAINER, Plan, Service

Runtime = Literal["docker", "pyxis"]
SECRETS_IN_CONTAINER = "/run/pdboot/secrets.env"
PYXIS_COMMON = ("--no-container-mount-home", "--no-container-entrypoint")
# A pyxis step's environment: NAME=value words up to `--` exported, then the command (POSIX sh
# builtins only, no `env` binary: a minimal image has a shell, not always coreutils)
ENV_PROGRAM = 'while [ "$1" != -- ]; do export "$1"; shift; done; shift; exec "$@"'
# ... after the secrets file, read on the node inside the container: the values never pass
# through the script
SECRETS_PROGRAM = f"set -a; . {SECRETS_IN_CONTAINER}; set +a; {ENV_PROGRAM}"
# The router's and the proxy's own secrets, in the job's private folder on the first node
# ("$OWN_SECRETS", 0700): the one line each uses, copied from the secrets file there by the
# script (slurm_text.py's own_secret), so neither container sees HF_TOKEN (`up` gives the
# router router-secrets.env the same way)
ROUTER_OWN_SECRETS = "router.env"  # OPENAI_API_KEY=, which vllm-router sends to the engines
PROXY_OWN_SECRETS = "proxy.env"  # VLLM_API_KEY=, the key the proxy checks


class Word(str):
    """A shell word to expand on the node (e.g. ``"${ADDR[1]}"``), written unquoted."""


class Image(str):
    """The image reference: it starts a line of its own in the script."""


def node_hosts(plan: Plan) -> list[str]:
    """Inventory hosts in the order they take the allocation's nodes: the router's first."""
    return [plan.router.host] + [h for h in plan.hosts if h != plan.router.host]


def addr(plan: Plan, host: str) -> Word:
    return Word(f'"${{ADDR[{node_hosts(plan).index(host)}]}}"')


def url(plan: Plan, s: Service) -> Word:
    return Word(f'"http://${{URLHOST[{node_hosts(plan).index(s.host)}]}}:{s.port}"')


def quote(words: Sequence[str]) -> str:
    return " ".join(w if isinstance(w, Word) else shlex.quote(w) for w in words)


def env_word(k: str, v: str) -> str:
    return Word(f"{shlex.quote(k)}={v}") if isinstance(v, Word) else f"{k}={v}"


def engine_args(plan: Plan, s: Service) -> list[str]:
    """`render`'s arguments of ``s``; a data-parallel head's address is its node's."""
    out: list[str] = list(s.command)
    if "--data-parallel-address" in out:
        i = out.index("--data-parallel-address") + 1
        head = next(h for h, hp in plan.hosts.items() if hp.address == out[i])
        out[i] = addr(plan, head)
    return out


def engine_env(plan: Plan, s: Service) -> list[tuple[str, str]]:
    """`render`'s environment of ``s``; the side-channel host is its node's address."""
    return [(k, addr(plan, s.host) if k == SIDE_CHANNEL_HOST else v) for k, v in s.environment]


def router_args(plan: Plan) -> list[str]:
    """`render`'s router arguments (its host's loopback, behind the proxy), its workers' URLs
    on their nodes, an inventory host's address (the metrics' router.metrics_bind) its
    node's."""
    by_url = {s.url: s for s in plan.engines}
    by_address = {hp.address: h for h, hp in plan.hosts.items() if hp.address}

    def word(a: str) -> str:
        if a in by_url:
            return url(plan, by_url[a])
        return addr(plan, by_address[a]) if a in by_address else a

    return [word(a) for a in plan.router.command]


def container_name(plan: Plan, name: str, host: str) -> Word:
    return Word(f'"{plan.router.project}-{name}-{host}-$SLURM_JOB_ID"')


@dataclass(frozen=True)
class Step:
    """One container of the job: what both runtimes need to start it."""

    name: str  # a service name (prefill, router, proxy, stage)
    host: str
    image: str
    # the program: ``entrypoint`` + ``args``; None: the image's own, which pyxis may not run
    # (--no-container-entrypoint), so its command names ``image_entrypoint`` itself
    entrypoint: tuple[str, ...] | None
    image_entrypoint: tuple[str, ...]
    args: list[str]
    env: list[tuple[str, str]]
    mounts: list[str]  # source:target[:ro], a source may be a Word
    secrets: bool  # the secrets file (or the container's own, secrets_file) reaches it
    service: Service | None = None  # docker's settings of an engine or the router
    # the file on the node: the whole secrets file for the engines and the weights step;
    # the router's and the proxy's own (their one variable, slurm_text.py's own_secret)
    secrets_file: str = '"$SECRETS_FILE"'

    @property
    def program(self) -> list[str]:
        return [*(self.entrypoint or self.image_entrypoint), *self.args]


def service_step(plan: Plan, s: Service) -> Step:
    mounts = [f"{m.source}:{m.target}" + (":ro" if m.read_only else "") for m in s.mounts]
    own: tuple[str, ...]
    if s.is_engine:
        own, args, env = ("vllm", "serve"), engine_args(plan, s), engine_env(plan, s)
    else:
        own, args, env = ("vllm-router",), router_args(plan), list(s.environment)
    secrets, file = s.env_file is not None, '"$SECRETS_FILE"'
    if not s.is_engine:  # OPENAI_API_KEY alone, as `up`'s router-secrets.env
        file = f'"$OWN_SECRETS"/{ROUTER_OWN_SECRETS}'
    return Step(s.name, s.host, s.image, s.entrypoint, own, args, env, mounts, secrets, s, file)


def stage_step(plan: Plan, host: str, w: WeightsStep, secrets: bool) -> Step:
    """The weights step on ``host``'s node (export/weights.py): the node's HF cache, rw."""
    mounts = [f"{w.hf_cache}:{HF_CACHE_IN_CONTAINER}"]
    cmd = w.command()
    return Step("stage", host, w.image, (cmd[0],), (), cmd[1:], w.environment(), mounts, secrets)


def proxy_step(plan: Plan, start: str, keyed: bool) -> Step:
    """The proxy on the router's node: the job's private proxy folder (nginx.conf, and the
    key's include the container writes there) and, with a key, its own secrets file (the
    VLLM_API_KEY line alone)."""
    mount = Word(f'"$PROXY_DIR":{PROXY_DIR_IN_CONTAINER}')
    image = plan.proxy.image if plan.proxy is not None else ""
    file = f'"$OWN_SECRETS"/{PROXY_OWN_SECRETS}'
    argv = ["-c", start]
    return Step("proxy", plan.router.host, image, ("sh",), (), argv, [], [mount], keyed, None, file)


def docker_argv(plan: Plan, step: Step) -> list[str]:
    """``docker run`` of one step on its node: compose's settings as flags."""
    name = container_name(plan, step.name, step.host)
    argv: list[str] = ["docker", "run", "--rm", "--name", name]
    network = step.service.network_mode if step.service is not None else "host"
    argv += ["--network", network, "--label", f"io.pdboot.deployment={plan.deployment}"]
    argv += [Word('--label "io.pdboot.slurm-job=$SLURM_JOB_ID"')]
    s = step.service
    if s is not None:
        if s.ipc is not None:
            argv += ["--ipc", s.ipc]
        if s.shm_size is not None:
            argv += ["--shm-size", s.shm_size]
        for u in s.ulimits:
            argv += ["--ulimit", f"{u.name}={u.soft}:{u.hard}"]
    for m in step.mounts:
        argv += ["-v", m]
    if s is not None:
        for d in s.devices:
            argv += ["--device", d]
        for c in s.cap_add:
            argv += ["--cap-add", c]
        if s.gpus is not None:
            ids = "all" if s.gpus == "all" else "device=" + ",".join(map(str, s.gpus))
            argv += ["--gpus", f'"{ids}"' if ids != "all" else ids]
    for k, v in step.env:
        argv += ["-e", env_word(k, v)]
    if step.secrets and step.name == "proxy":
        # only the proxy reads the file itself (its key); the others get it as variables
        argv += ["-v", Word(f"{step.secrets_file}:{SECRETS_IN_CONTAINER}:ro")]
    elif step.secrets:
        argv += ["--env-file", Word(step.secrets_file)]
    if step.entrypoint is None:  # the image's own, as compose runs it
        return [*argv, Image(step.image), *step.args]
    argv += ["--entrypoint", step.entrypoint[0], Image(step.image)]
    return [*argv, *step.entrypoint[1:], *step.args]


def pyxis_argv(plan: Plan, step: Step) -> list[str]:
    """The step's options and command under pyxis/enroot (``srun --container-image``)."""
    mounts = list(step.mounts)
    s = step.service
    if s is not None:
        mounts += [d.split(":")[0] + ":" + d.split(":")[-1] for d in s.devices]
    if step.secrets:
        mounts.append(Word(f"{step.secrets_file}:{SECRETS_IN_CONTAINER}:ro"))
    words: list[str] = [f"--container-image={step.image}", *PYXIS_COMMON]
    if mounts:
        # one word: literal parts quoted, the node's paths expanded there
        parts = [m if isinstance(m, Word) else shlex.quote(m) for m in mounts]
        words.append(Word("--container-mounts=" + ",".join(parts)))
    env = list(step.env)
    if s is not None and isinstance(s.gpus, tuple):
        env.append(("CUDA_VISIBLE_DEVICES", ",".join(map(str, s.gpus))))
    secrets = step.secrets and step.name != "proxy"
    program = Word('"$PYXIS_SECRETS_ENV"' if secrets else '"$PYXIS_ENV"')  # slurm.py sets them
    env_words = [env_word(k, v) for k, v in env]
    command = ["sh", "-c", program, "pdboot", *env_words, "--", *step.program]
    return [*words, "--", *command]
