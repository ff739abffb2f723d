"""Fuzz the inventory path: mutated inventories through load -> plan -> render, in process.

Every case is a mutation of ``inventory.example.yaml`` or a file in ``examples/``: a value
from one of the refused classes of issue 18 put at its key (each one must be refused with
``file:line``), a random structural change (types, deletions, huge or odd values), or a
mangled text (bytes flipped, lines dropped or repeated). Each case runs under a per-case
timeout (SIGALRM). The run stops by itself after ``--cases`` cases and reports:

- tracebacks: anything other than InventoryError escaping load/plan/render;
- hangs: a case past the timeout;
- unlocated: an InventoryError issue without ``file:line``;
- escaped: an injected invalid value that was accepted, or an accepted inventory whose
  rendered output breaks an invariant checked here independently of pdboot's validators
  (a real argparse parser over the real option lists, the YAML reloaded, the paths).

Exit 0 only when all four are 0. Reproduce: ``python3 scripts/fuzz_inventory.py --cases
3000 --seed 4242`` (prints the figures; ``--show N`` prints N examples of each problem).
The ``watch:`` and ``weights:`` sections come from scripts/fuzz_sections.py: generated
onto every base before its mutation, with their own refused classes and oracles.
"""

from __future__ import annotations

import argparse
import copy
import random
import re
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdboot.inventory.load import InventoryError, parse_inventory  # noqa: E402
from pdboot.inventory.optionlists import VLLM_ROUTER, VLLM_SERVE  # noqa: E402
from pdboot.plan.build import build_plan  # noqa: E402
from pdboot.plan.render import render_all  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_sections  # noqa: E402

Data = dict[str, Any]

# ----------------------------------------------------------------------------- oracles
# Written from the sources, not from pdboot's validators: the point is to catch them.

ENGINE_MANAGED = {
    "--port", "--host", "--model", "--served-model-name", "--tensor-parallel-size",
    "--kv-transfer-config", "--data-parallel-size", "--data-parallel-size-local",
    "--data-parallel-address", "--data-parallel-rpc-port", "--data-parallel-start-rank",
    "--headless", "--enable-expert-parallel", "-tp", "-dp", "-dpl", "-dpa", "-dpp", "-dpr",
    "-ep", "--api-key", "--hf-token",
}  # fmt: skip
ROUTER_MANAGED = {
    "--host", "--port", "--prefill", "--decode", "--prefill-policy", "--decode-policy",
    "--vllm-pd-disaggregation", "--cache-threshold", "--balance-abs-threshold",
    "--prometheus-host", "--prometheus-port", "--request-timeout-secs",
    "--intra-node-data-parallel-size", "--api-key",
}  # fmt: skip
MANAGED_ENV = {"HF_HOME", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}
SENSITIVE = (
    "/run", "/var/run", "/var/empty", "/var/lib/docker", "/var/lib/dpkg", "/var/lib/containerd",
    "/etc", "/usr", "/proc", "/sys", "/dev", "/boot", "/bin", "/sbin", "/lib",
)  # fmt: skip
# distribution/reference's grammar (regexp.go), anchored
_COMP = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOM = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"  # noqa: E501
REFERENCE = re.compile(
    rf"(?:{_DOM}/)?{_COMP}(?:/{_COMP})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,
)


def _argparse_for(options: tuple[str, ...]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for o in options:
        p.add_argument(o, nargs="?", dest="o" + o.replace("-", "_"))

    def error(message: str) -> None:
        raise argparse.ArgumentError(None, message)

    p.error = error  # type: ignore[method-assign]
    return p


ENGINE_PARSER = _argparse_for(VLLM_SERVE)
ROUTER_PARSER = _argparse_for(VLLM_ROUTER)


def _option_used(parser: argparse.ArgumentParser, arg: str) -> set[str] | None:
    """The options argparse takes ``arg`` for; None when it refuses it (ambiguous)."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return set()
    flag, eq, value = arg.partition("=")
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")  # vLLM's parser accepts both
    try:
        ns, _ = parser.parse_known_args([flag + eq + value])
    except (argparse.ArgumentError, SystemExit):
        return None
    return {k for k, v in vars(ns).items() if v is not None}


def _dest(o: str) -> str:
    return "o" + o.replace("-", "_")


def invariants(inv: Any, rendered: dict[str, str]) -> list[str]:
    """What must hold for any accepted inventory (empty list: all hold)."""
    bad: list[str] = []
    tiers = {"prefill": inv.prefill, "decode": inv.decode}
    for tname, tier in tiers.items():
        for a in tier.extra_args:
            if a == "":
                bad.append(f"{tname}: empty extra arg accepted")
            used = _option_used(ENGINE_PARSER, a)
            if used is None:
                bad.append(f"{tname}: ambiguous abbreviation {a!r} accepted")
            elif used & {_dest(m) for m in ENGINE_MANAGED if m.startswith("-")}:
                bad.append(f"{tname}: {a!r} sets a managed or secret flag")
        for k in tier.env:
            if k in MANAGED_ENV or k.startswith(("UCX_", "VLLM_NIXL_SIDE_CHANNEL")):
                bad.append(f"{tname}: env {k} overrides pdboot's")
    for a in inv.router.extra_args:
        if a == "":
            bad.append("router: empty extra arg accepted")
        used = _option_used(ROUTER_PARSER, a)
        if used is None:
            bad.append(f"router: ambiguous abbreviation {a!r} accepted")
        elif used & {_dest(m) for m in ROUTER_MANAGED}:
            bad.append(f"router: {a!r} sets a managed or secret flag")
    if inv.served_model_name is not None and inv.served_model_name.startswith("-"):
        bad.append("served_model_name starts with -")
    for img in (inv.image, inv.router_image):
        first = img.split("/", 1)[0]
        # Docker's normalisation: a first component is a registry only with . or : or as
        # localhost; otherwise it is part of the (lowercase) repository
        as_repo = "/" not in img or not ("." in first or ":" in first or first == "localhost")
        if (
            not REFERENCE.fullmatch(img)
            or (as_repo and first != first.lower())
            or len(img.split("@")[0].rsplit(":", 1)[0]) > 255
        ):
            bad.append(f"invalid image reference {img!r} accepted")
    shm = inv.container.shm_size
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([bkmgt]?)", shm, re.ASCII)
    if not m:
        bad.append(f"shm_size {shm!r} is not an ASCII size")
    else:
        mult = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m[2]]
        if float(m[1]) * mult > 4 << 40:
            bad.append(f"absurd shm_size {shm!r} accepted")
    req = inv.requirements
    for name in ("cuda", "min_driver", "compute_capability"):
        v = getattr(req, name)
        if not re.fullmatch(r"[0-9.]+", v, re.ASCII):
            bad.append(f"requirements.{name} {v!r} has non-ASCII digits")
    seen: dict[tuple[str, int], str] = {}
    for hname, h in inv.hosts.items():
        if not h.address.isascii() or "%" in h.address:
            bad.append(f"host {hname}: address {h.address!r} accepted")
        if (
            h.advertise_address is not None
            and h.address != "local"
            and (h.advertise_address != h.address)
        ):
            bad.append(f"host {hname}: advertise_address on a non-local host accepted")
        key = (
            h.address if h.address != "local" else f"local:{h.advertise_address}",
            h.ssh.port or inv.ssh.port or 22,
        )
        if key in seen:
            bad.append(f"hosts {seen[key]} and {hname} share an address")
        seen[key] = hname
    pdir = f"{inv.remote_dir.rstrip('/')}/{inv.name}"
    mounts = [inv.container.hf_cache] + ([inv.model] if inv.model.startswith("/") else [])
    for p in [*mounts, inv.remote_dir]:
        parts = p.split("/")
        if any(p == t or p.startswith(t + "/") for t in SENSITIVE):
            bad.append(f"sensitive path {p!r} accepted")
        if ".ssh" in parts or p.endswith(".sock") or (len(parts) == 3 and parts[1] == "home"):
            bad.append(f"sensitive path {p!r} accepted")
    for p in mounts:
        if p == pdir or p.startswith(pdir + "/") or p.startswith(pdir + ".lock"):
            bad.append(f"mount {p!r} is inside the project dir {pdir}")
        if inv.remote_dir == p or inv.remote_dir.startswith(p.rstrip("/") + "/"):
            bad.append(f"mount {p!r} contains remote_dir {inv.remote_dir}")
    # the rendered YAML reads back as the plan says (NEL, LS, PS, BOM, $)
    plan = build_plan(inv)
    bad += fuzz_sections.invariants(inv, plan, REFERENCE)
    for host, text in rendered.items():
        doc = yaml.safe_load(text)
        for svc in plan.hosts[host].services:
            if svc.name not in doc["services"]:  # the self-check's bypass: another plan
                continue
            got = [c.replace("$$", "$") for c in doc["services"][svc.name]["command"]]
            if got != list(svc.command):
                bad.append(f"{host}/{svc.name}: command reads back changed")
            for ef in doc["services"][svc.name].get("env_file", []):
                if ef.get("required") is not True:
                    bad.append(f"{host}/{svc.name}: env_file not required")
    return bad


# ----------------------------------------------------------------------------- mutations


def _tiers(d: Data) -> list[Data]:
    return [d[t] for t in ("prefill", "decode") if isinstance(d.get(t), dict)]


def _hosts(d: Data) -> dict[str, Any]:
    h = d.get("hosts")
    return h if isinstance(h, dict) else {}


def _set_extra(section: str, values: list[str]) -> Callable[[Data, random.Random], bool]:
    def m(d: Data, r: random.Random) -> bool:
        target = d.get(section)
        if not isinstance(target, dict):
            return False
        args = list(target.get("extra_args") or [])
        args.insert(r.randint(0, len(args)), r.choice(values))
        if not args[-1].startswith("-") or "=" in args[-1]:
            pass
        target["extra_args"] = [*args, "1"]
        return True

    return m


def _top(key: str, values: list[Any]) -> Callable[[Data, random.Random], bool]:
    def m(d: Data, r: random.Random) -> bool:
        d[key] = r.choice(values)
        return True

    return m


def _nested(keys: tuple[str, ...], values: list[Any]) -> Callable[[Data, random.Random], bool]:
    def m(d: Data, r: random.Random) -> bool:
        cur = d
        for k in keys[:-1]:
            nxt = cur.get(k)
            if nxt is None:
                nxt = cur[k] = {}
            if not isinstance(nxt, dict):
                return False
            cur = nxt
        cur[keys[-1]] = r.choice(values)
        return True

    return m


def _host_address(values: list[str]) -> Callable[[Data, random.Random], bool]:
    def m(d: Data, r: random.Random) -> bool:
        hosts = [h for h in _hosts(d).values() if isinstance(h, dict)]
        if not hosts:
            return False
        r.choice(hosts)["address"] = r.choice(values)
        return True

    return m


def _duplicate_address(d: Data, r: random.Random) -> bool:
    hosts = [h for h in _hosts(d).values() if isinstance(h, dict) and h.get("address") != "local"]
    if len(hosts) < 2:
        return False
    a, b = r.sample(hosts, 2)
    b["address"] = a["address"]
    for h in (a, b):  # same port too (a different port is another sshd, maybe a container)
        if isinstance(h.get("ssh"), dict):
            h["ssh"].pop("port", None)
    return True


def _advertise_remote(d: Data, r: random.Random) -> bool:
    hosts = [h for h in _hosts(d).values() if isinstance(h, dict) and h.get("address") != "local"]
    if not hosts:
        return False
    r.choice(hosts)["advertise_address"] = "10.9.9.9"
    return True


def _tier_env(d: Data, r: random.Random) -> bool:
    tiers = _tiers(d)
    if not tiers:
        return False
    t = r.choice(tiers)
    env = dict(t.get("env") or {})
    env[r.choice(["HF_HOME", "UCX_NET_DEVICES", "CUDA_VISIBLE_DEVICES", "UCX_TLS"])] = "x"
    t["env"] = env
    return True


def _name_hf_cache(d: Data, r: random.Random) -> bool:
    d["name"] = "hf-cache"
    d.pop("remote_dir", None)
    d.setdefault("container", {})
    if isinstance(d["container"], dict):
        d["container"].pop("hf_cache", None)
    return True


ABBREV_ENGINE = ["--po", "--por", "--api-ke", "--api_key", "--hf-tok", "--kv-transfer",
                 "--served-model", "--tensor-parallel", "--data-parallel-si", "--head",
                 "--api-key=x", "--hf-token=abc", "-t", "-tp=2", "--p"]  # fmt: skip
ABBREV_ROUTER = ["--api-ke", "--prometheus-po", "--prometheus-ho", "--request-timeout",
                 "--prefill-pol", "--cache-thr", "--balance-abs", "--vllm-pd", "--intra",
                 "--p", "--api-key=x", "--po", "--ho"]  # fmt: skip
NON_ASCII_DIGITS = ["\u0661\u0666g", "\u0967\u0969g", "\uff11\uff16g", "1\u06f6g"]

# (class name, mutator): each must be refused
INVALID: list[tuple[str, Callable[[Data, random.Random], bool]]] = [
    ("engine flag abbreviation", _set_extra("prefill", ABBREV_ENGINE)),
    ("engine flag abbreviation", _set_extra("decode", ABBREV_ENGINE)),
    ("router flag abbreviation", _set_extra("router", ABBREV_ROUTER)),
    ("empty extra arg", _set_extra("router", [""])),
    ("empty extra arg", _set_extra("decode", [""])),
    ("served_model_name flag", _top("served_model_name", ["-rf", "--help", "-"])),
    ("invalid image", _top("image", ["Vllm/vllm-openai:v0.33.0", "vllm/", "vllm/vllm-openai:v0:33",
                                     "vllm//x", "a:b:c:d", "vllm/x@sha256:abc", ":tag"])),
    ("invalid image", _top("router_image", ["Vllm/vllm-router:v0.1.17", "vllm/x:-bad"])),
    ("non-ASCII shm_size", _nested(("container", "shm_size"), NON_ASCII_DIGITS)),
    ("absurd shm_size", _nested(("container", "shm_size"), ["999999999t", "5t", "99999999g"])),
    ("non-ASCII version", _nested(("requirements", "cuda"), ["\u0661\u0663.\u0660", "1\u0663.0"])),
    ("non-ASCII version", _nested(("requirements", "min_driver"), ["\u0665\u0668\u0660.65"])),
    ("non-ASCII version", _nested(("requirements", "compute_capability"), ["\u0661\u0662.0"])),
    ("IPv6 zone id", _host_address(["fe80::1%eth0", "fe80::1%p", "[fe80::2%25eth0]"])),
    (
        "non-ASCII host name",
        _host_address(["\u212aeys.example", "gpu-\u0430.example", "ﬁle.example"]),
    ),
    ("duplicate address", _duplicate_address),
    ("advertise_address on a non-local host", _advertise_remote),
    ("tier env overrides pdboot's", _tier_env),
    ("sensitive hf_cache", _nested(("container", "hf_cache"), [
        "/var/run/docker.sock", "/root/.ssh", "/home/alice/.ssh", "/home/alice",
        "/var/lib/docker/volumes", "/var/lib/pdboot", "/var/empty/sshd", "/run/x"])),
    ("sensitive remote_dir", _top("remote_dir", ["/var/empty", "/var/lib/dpkg", "/var/lib/docker",
                                                 "/root/.ssh", "/run/pd"])),
    ("hf_cache is the project dir", _name_hf_cache),
    *fuzz_sections.INVALID,  # watch: and weights: (issue 32)
]  # fmt: skip

ODD_TEXT = ["a\u2028b", "x\x85y", "p\u2029q", "\ufeffz", "$HOME", "${X:-y}", "é", "a b"]
WEIRD_VALUES: list[Any] = [
    None, True, 0, -1, 2**63, 10**40, 1.5, float("inf"), "", " ", "x" * 5000, [], {}, [1, [2]],
    "local", "127.0.0.1", "::1", "0x7f000001", "%h", "$(id)", "`id`", ";id", "\x00", "\t",
    "../../etc", "/", "all", "on", "no", "~", "2001:db8::1", "\u202e", *ODD_TEXT,
]  # fmt: skip


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def structural(d: Data, r: random.Random) -> None:
    """One to three random changes at random key paths."""
    for _ in range(r.randint(1, 3)):
        paths = _paths(d)
        if not paths:
            return
        path = r.choice(paths)
        parent: Any = d
        for p in path[:-1]:
            parent = parent[p]
        last = path[-1]
        op = r.random()
        if op < 0.2 and isinstance(parent, dict):
            del parent[last]
        elif op < 0.3 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))
        elif op < 0.4 and isinstance(parent, dict):
            parent[r.choice(["extra", "Name", "kv_role", str(last) + "s"])] = r.choice(WEIRD_VALUES)
        else:
            parent[last] = copy.deepcopy(r.choice(WEIRD_VALUES))


def odd_args(d: Data, r: random.Random) -> bool:
    """Valid but odd extra_args (item 9): must read back identically once rendered."""
    tiers = _tiers(d)
    if not tiers:
        return False
    t = r.choice(tiers)
    t["extra_args"] = [*(t.get("extra_args") or []), "--chat-template", r.choice(ODD_TEXT)]
    return True


def textual(text: str, r: random.Random) -> str:
    lines = text.splitlines(keepends=True)
    for _ in range(r.randint(1, 4)):
        op = r.random()
        if op < 0.3 and lines:
            del lines[r.randrange(len(lines))]
        elif op < 0.5 and lines:
            i = r.randrange(len(lines))
            lines.insert(i, lines[i])
        elif op < 0.7 and lines:
            i = r.randrange(len(lines))
            lines[i] = " " * r.randint(0, 3) + lines[i]
        else:
            raw = bytearray("".join(lines).encode())
            if raw:
                i = r.randrange(len(raw))
                raw[i] = r.choice(b"{}[]:,&*!|>'\"#%@`-?\n\t \x00\xff")
            lines = raw.decode("utf-8", "replace").splitlines(keepends=True)
    return "".join(lines)


# ----------------------------------------------------------------------------- running


class Hang(Exception):
    pass


def _alarm(_sig: int, _frame: Any) -> None:
    raise Hang


def run_case(text: str, name: str, timeout: float) -> tuple[str, Any]:
    """("accepted", (inv, rendered)) | ("refused", issues) | ("traceback", text) | ("hang", "")"""
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        inv = parse_inventory(text, file=name)
        rendered = render_all(build_plan(inv))
        return "accepted", (inv, rendered)
    except InventoryError as e:
        return "refused", e.issues
    except Hang:
        return "hang", ""
    except Exception:
        return "traceback", traceback.format_exc(limit=6)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def oracle_self_check(bases: list[Path]) -> None:
    """Every base is accepted and passes the invariants, and the invariants do catch each
    class when pdboot's validators are bypassed (model_copy does not validate): else a
    figure of 0 escapes would prove nothing."""
    for p in bases:
        outcome, detail = run_case(p.read_text(), p.name, 30.0)
        assert outcome == "accepted", (p, outcome, detail)
        assert not invariants(*detail), (p, invariants(*detail))
    inv, rendered = run_case(bases[0].read_text(), bases[0].name, 30.0)[1]
    host = next(iter(inv.hosts))
    bad_host = inv.hosts[host].model_copy(update={"address": "fe80::1%eth0"})
    bypass = [
        {"served_model_name": "-rf"},
        {"image": "Vllm/vllm-openai:v0.33.0"},
        {"router": inv.router.model_copy(update={"extra_args": ["--api-ke", "x"]})},
        {"decode": inv.decode.model_copy(update={"extra_args": ["--po", "1"]})},
        {"decode": inv.decode.model_copy(update={"extra_args": [""]})},
        {"prefill": inv.prefill.model_copy(update={"env": {"HF_HOME": "/x"}})},
        {"container": inv.container.model_copy(update={"shm_size": "\u0661\u0666g"})},
        {"container": inv.container.model_copy(update={"hf_cache": "/var/run/docker.sock"})},
        {"hosts": {**inv.hosts, host: bad_host}},
    ]
    for update in bypass + fuzz_sections.bypasses(inv):
        assert invariants(inv.model_copy(update=update), rendered), update
    # a rendered file whose command reads back changed is caught too
    name, text = next(iter(rendered.items()))
    plan = build_plan(inv)
    svc = plan.hosts[name].services[0]
    changed = text.replace(f"- {svc.command[-1]}", f"- '{svc.command[-1]}\u2028x'", 1)
    if changed != text:
        assert invariants(inv, {**rendered, name: changed})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds per case")
    ap.add_argument("--show", type=int, default=3, help="examples of each problem to print")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGALRM, _alarm)
    r = random.Random(args.seed)
    bases = [ROOT / "inventory.example.yaml", *sorted((ROOT / "examples").glob("*.yaml"))]
    base_data = {p.name: yaml.safe_load(p.read_text()) for p in bases}
    oracle_self_check(bases)
    counts: Counter[str] = Counter()
    refused_by_class: Counter[str] = Counter()
    problems: dict[str, list[str]] = {"traceback": [], "hang": [], "unlocated": [], "escaped": []}
    t0 = time.monotonic()
    case = 0
    while case < args.cases:
        base = r.choice(bases).name
        data = copy.deepcopy(base_data[base])
        fuzz_sections.add_sections(data, r)  # so every kind of case reaches them
        kind = r.random()
        injected = ""
        if kind < 0.45:
            cls, mut = r.choice(INVALID)
            if not mut(data, r):
                continue
            injected = cls
            text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
        elif kind < 0.55:
            if not odd_args(data, r):
                continue
            text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
        elif kind < 0.85:
            structural(data, r)
            text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
        else:
            text = textual((ROOT / ("examples" if base != "inventory.example.yaml" else "")
                            / base).read_text(), r)  # fmt: skip
        case += 1
        label = f"case {case} ({base}{', ' + injected if injected else ''})"
        outcome, detail = run_case(text, f"{base}#{case}", args.timeout)
        counts[outcome] += 1
        if outcome == "traceback":
            problems["traceback"].append(f"{label}:\n{detail}")
        elif outcome == "hang":
            problems["hang"].append(label)
        elif outcome == "refused":
            where = re.compile(rf"^{re.escape(base)}#{case}:\d+: ")
            loose = [str(i) for i in detail if not where.match(str(i))]
            if loose:
                problems["unlocated"].append(f"{label}: {loose[0]}")
            if injected:
                refused_by_class[injected] += 1
        else:
            inv, rendered = detail
            broken = invariants(inv, rendered)
            if injected:
                broken.insert(0, f"injected {injected!r} was accepted")
            if broken:
                problems["escaped"].append(f"{label}: {'; '.join(broken[:3])}")
    took = time.monotonic() - t0
    print(f"{case} cases in {took:.1f}s (seed {args.seed}, {args.timeout:g}s per case) from "
          f"{len(bases)} base files")  # fmt: skip
    print(f"  accepted {counts['accepted']}, refused {counts['refused']}")
    for cls in sorted({c for c, _ in INVALID}):
        print(f"  refused as it must be: {refused_by_class[cls]:4d}  {cls}")
    for what, found in problems.items():
        print(f"  {what}: {len(found)}")
        for line in found[: args.show]:
            print("    " + line.replace("\n", "\n    "))
    return 0 if not any(problems.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
