"""Plan -> a Slurm batch script (pure; no I/O): the deployment `render` lays out as compose
files, run on one allocation with the same engines, arguments, environment and KV transfer
config, started and waited for as `up` does, and torn down when the job ends.

Node roles come from ``SLURM_JOB_NODELIST``, not heterogeneous job components: pdboot's plan
is per host (both tiers may share one, an engine's ports and GPU groups were checked per
host), so the allocation gets one node per inventory host, the router's host first (the
batch script runs there: it waits for the engines and the router, as `up` does). A het job
gives each component its own nodes and could not keep colocated tiers together.

Every address the plan took from the inventory (the NIXL side-channel host, the router's
worker URLs, a data-parallel head) becomes the address Slurm has for the node that plays the
host (``scontrol show node``: NodeAddr). Secrets stay on the nodes: a file there (`up`'s
``secrets.env`` path by default) passed to the containers, never read into the script.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Literal

from pdboot.export.common import (
    SIDE_CHANNEL_HOST,
    endpoint_port,
    endpoint_router_command,
    engines,
)
from pdboot.export.slurm_text import PRELUDE, RUN
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import SECRETS_FILE, Plan, Service

Runtime = Literal["docker", "pyxis"]
SECRETS_IN_CONTAINER = "/run/pdboot/secrets.env"


@dataclass(frozen=True)
class SlurmOptions:
    runtime: Runtime = "docker"
    partition: str | None = None
    time: str | None = None  # --time, e.g. 1-00:00:00; None: the partition's default
    secrets_file: str | None = None  # on the nodes; None: `up`'s path


class Word(str):
    """A shell word to expand on the node (e.g. ``"${ADDR[1]}"``), written unquoted."""


class Image(str):
    """The image reference: it starts a line of its own in the script."""


def node_hosts(plan: Plan) -> list[str]:
    """Inventory hosts in the order they take the allocation's nodes: the router's first."""
    return [plan.router.host] + [h for h in plan.hosts if h != plan.router.host]


def _addr(plan: Plan, host: str) -> Word:
    return Word(f'"${{ADDR[{node_hosts(plan).index(host)}]}}"')


def _url(plan: Plan, s: Service) -> Word:
    return Word(f'"http://${{URLHOST[{node_hosts(plan).index(s.host)}]}}:{s.port}"')


def _quote(words: list[str]) -> str:
    return " ".join(w if isinstance(w, Word) else shlex.quote(w) for w in words)


def secrets_path(inv: Inventory, opts: SlurmOptions) -> str:
    return opts.secrets_file or f"{inv.remote_dir.rstrip('/')}/{inv.name}/{SECRETS_FILE}"


def engine_args(plan: Plan, s: Service) -> list[str]:
    """`render`'s arguments of ``s``; a data-parallel head's address is its node's."""
    out: list[str] = list(s.command)
    if "--data-parallel-address" in out:
        i = out.index("--data-parallel-address") + 1
        head = next(h for h, hp in plan.hosts.items() if hp.address == out[i])
        out[i] = _addr(plan, head)
    return out


def engine_env(plan: Plan, s: Service) -> list[tuple[str, str]]:
    """`render`'s environment of ``s``; the side-channel host is its node's address."""
    return [(k, _addr(plan, s.host) if k == SIDE_CHANNEL_HOST else v) for k, v in s.environment]


def router_args(plan: Plan) -> list[str]:
    """`render`'s router arguments, its workers' URLs on their nodes."""
    by_url = {s.url: s for s in plan.engines}
    return [_url(plan, by_url[a]) if a in by_url else a for a in endpoint_router_command(plan)]


def container_name(plan: Plan, s: Service) -> Word:
    return Word(f'"{plan.router.project}-{s.name}-{s.host}-$SLURM_JOB_ID"')


def _env_word(k: str, v: str) -> str:
    return Word(f"{shlex.quote(k)}={v}") if isinstance(v, Word) else f"{k}={v}"


def docker_argv(inv: Inventory, plan: Plan, s: Service, opts: SlurmOptions) -> list[str]:
    """``docker run`` of one service on its node: compose's settings as flags."""
    argv: list[str] = ["docker", "run", "--rm", "--name", container_name(plan, s)]
    argv += ["--network", s.network_mode, "--label", f"io.pdboot.deployment={plan.deployment}"]
    argv += [Word('--label "io.pdboot.slurm-job=$SLURM_JOB_ID"')]
    if s.ipc is not None:
        argv += ["--ipc", s.ipc]
    if s.shm_size is not None:
        argv += ["--shm-size", s.shm_size]
    for u in s.ulimits:
        argv += ["--ulimit", f"{u.name}={u.soft}:{u.hard}"]
    for m in s.mounts:
        argv += ["-v", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")]
    for d in s.devices:
        argv += ["--device", d]
    for c in s.cap_add:
        argv += ["--cap-add", c]
    if s.gpus is not None:
        ids = "all" if s.gpus == "all" else "device=" + ",".join(map(str, s.gpus))
        argv += ["--gpus", f'"{ids}"' if ids != "all" else ids]
    env = engine_env(plan, s) if s.is_engine else list(s.environment)
    for k, v in env:
        argv += ["-e", _env_word(k, v)]
    if s.env_file is not None:
        argv += ["--env-file", Word('"$SECRETS_FILE"')]
    if s.entrypoint is not None:
        argv += ["--entrypoint", s.entrypoint[0]]
    argv.append(Image(s.image))
    return argv + (engine_args(plan, s) if s.is_engine else router_args(plan))


def pyxis_argv(inv: Inventory, plan: Plan, s: Service, opts: SlurmOptions) -> list[str]:
    """The step's options and command under pyxis/enroot (``srun --container-image``): the
    image's entrypoint is not run by pyxis, so the command names ``vllm serve``."""
    mounts = [f"{m.source}:{m.target}" + (":ro" if m.read_only else "") for m in s.mounts]
    if s.devices:
        mounts += [d.split(":")[0] + ":" + d.split(":")[-1] for d in s.devices]
    opts_words: list[str] = [f"--container-image={s.image}", "--no-container-mount-home"]
    if s.env_file is not None:
        mounts.append(Word(f'"$SECRETS_FILE":{SECRETS_IN_CONTAINER}:ro'))
    if mounts:
        # one word: literal parts quoted, the secrets path expanded on the node
        parts = [m if isinstance(m, Word) else shlex.quote(m) for m in mounts]
        opts_words.append(Word("--container-mounts=" + ",".join(parts)))
    env = engine_env(plan, s) if s.is_engine else list(s.environment)
    if isinstance(s.gpus, tuple):
        env.append(("CUDA_VISIBLE_DEVICES", ",".join(map(str, s.gpus))))
    command = ["env", *(_env_word(k, v) for k, v in env)]
    if s.is_engine:
        command += ["vllm", "serve", *engine_args(plan, s)]
    else:
        command += [*(s.entrypoint or ("vllm-router",)), *router_args(plan)]
    if s.env_file is not None:
        # read on the node, inside the container: the values never pass through the script
        load = f'set -a; . {SECRETS_IN_CONTAINER}; set +a; exec "$@"'
        command = ["bash", "-c", load, "pdboot", *command]
    return [*opts_words, "--", *command]


def _array(name: str, words: list[str]) -> str:
    """A bash array, one option (with its value) per line."""
    lines: list[list[str]] = [[]]
    for w in words:
        starts = isinstance(w, Image) or (w.startswith("-") and not isinstance(w, Word))
        if starts and lines[-1]:
            lines.append([])
        lines[-1].append(w)
    return f"{name}=(\n" + "".join(f"  {_quote(ws)}\n" for ws in lines) + ")"


def _header(inv: Inventory, plan: Plan, opts: SlurmOptions) -> list[str]:
    lines = [
        "#!/bin/bash",
        f"# Generated by `pdboot export slurm` from deployment {plan.deployment!r}; pdboot's",
        "# plan, as `pdboot render` lays it out, run on one Slurm allocation (docs/export.md).",
        f"#SBATCH --job-name={plan.router.project}",
        f"#SBATCH --nodes={len(plan.hosts)}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive",
        "#SBATCH --output=slurm-%x-%j.out",
    ]
    per_host = [_gpus_on(inv, plan, h) for h in plan.hosts]
    if any(per_host):
        lines.append(f"#SBATCH --gres=gpu:{max(per_host)}")
    if opts.partition:
        lines.append(f"#SBATCH --partition={opts.partition}")
    if opts.time:
        lines.append(f"#SBATCH --time={opts.time}")
    return lines


def _gpus_on(inv: Inventory, plan: Plan, host: str) -> int:
    from pdboot.export.common import gpu_count

    return sum(gpu_count(inv, s) for s in plan.engines if s.host == host and s.gpus is not None)


def _launch(inv: Inventory, plan: Plan, s: Service, n: int, opts: SlurmOptions) -> list[str]:
    node = node_hosts(plan).index(s.host)
    what = f"{s.key}: {s.url if not s.headless else 'headless'}"
    if s.side_channel_port is not None:
        what += f", NIXL side channel :{s.side_channel_port}"
    if opts.runtime == "docker":
        body = _array(f"CMD_{n}", docker_argv(inv, plan, s, opts))
        name = container_name(plan, s)
        call = f'start_docker {n} {node} {shlex.quote(s.key)} {name} "${{CMD_{n}[@]}}"'
    else:
        body = _array(f"CMD_{n}", pyxis_argv(inv, plan, s, opts))
        call = f'start_pyxis {n} {node} {shlex.quote(s.key)} "${{CMD_{n}[@]}}"'
    return [f"# {what}", body, call]


def _ready_url(plan: Plan, s: Service) -> Word:
    head = next((e for e in plan.engines if e.url == s.head_url), s) if s.headless else s
    i = node_hosts(plan).index(head.host)
    return Word(f'"http://${{URLHOST[{i}]}}:{head.port}/health"')


def render_slurm(inv: Inventory, plan: Plan, opts: SlurmOptions | None = None) -> dict[str, str]:
    """File name -> text: the batch script."""
    opts = opts or SlurmOptions()
    es = engines(plan)
    hosts = node_hosts(plan)
    lines = _header(inv, plan, opts)
    lines += [
        "",
        f"DEPLOYMENT={shlex.quote(plan.deployment)}",
        "# inventory hosts, in the order they take the allocation's nodes (the router's first)",
        "HOSTS=(" + _quote(hosts) + ")",
        f"RUNTIME={opts.runtime}",
        # a path on the nodes, never the secrets themselves (PDBOOT_SECRETS_FILE overrides it)
        f"SECRETS_FILE=${{PDBOOT_SECRETS_FILE:-{shlex.quote(secrets_path(inv, opts))}}}",
        f"NEEDS_SECRETS={1 if any(s.env_file for s in (*es, plan.router)) else 0}",
        f"READY_SECONDS={int(inv.timeouts.ready_seconds)}",
        f"ROUTER_READY_SECONDS={int(inv.timeouts.router_ready_seconds)}",
        f"ENDPOINT_PORT={endpoint_port(plan)}",
        f"WORKERS={sum(1 for s in es if not s.headless)}",
        f"LIVE_WORKERS={1 if '--enable-igw' in plan.router.command else 0}",
        # the served name as a JSON string, for add_worker's body
        f"MODEL_ID_JSON={shlex.quote(json.dumps(plan.served_model_name))}",
        PRELUDE,
        "# --- engines: every one together, as `pdboot up` starts them ---",
    ]
    for n, s in enumerate(es):
        lines += _launch(inv, plan, s, n, opts)
    lines += [
        "",
        "# --- readiness: every engine's /health (a follower's is its head's) ---",
        "ENGINES_DEADLINE=$((SECONDS + READY_SECONDS))",
    ]
    for n, s in enumerate(es):
        lines.append(f"wait_engine {n} {shlex.quote(s.key)} {_ready_url(plan, s)}")
    router_n = len(es)
    lines += ["", f"# --- the router on the first node: {plan.router.key} ---"]
    lines += _launch(inv, plan, plan.router, router_n, opts)
    lines.append(f"wait_router_health {router_n}")
    if "--enable-igw" in plan.router.command:
        # IGW mode ignores the static lists: `up` posts every engine, and so does this
        lines += [f"add_worker {_url(plan, s)} {s.role}" for s in es if not s.headless]
    lines += [f"wait_workers {router_n}", RUN]
    return {f"{plan.router.project}.sbatch": "\n".join(lines) + "\n"}
