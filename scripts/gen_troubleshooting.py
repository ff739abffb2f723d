"""Regenerate docs/troubleshooting.md: symptom -> cause -> fix, from the code that decides them.

Sources: the log signatures `up`, `status` and `logs --diagnose` match
(pdboot/verify/diagnose.py SIGNATURES: pattern, cause, fix), and every preflight check id
with the failure and warning texts and fixes its code prints, read from the source of
pdboot/preflight/ (the calls ``CheckResult(id, status, message, fix)``, gpu's
``_fail(id, message, fix)`` and ``unparsed(id, ...)``); a part of a message computed at run
time shows as <expression>. tests/unit/repo/test_troubleshooting.py checks that the committed
file is what this script writes and that it names every signature and check id.

    python3 scripts/gen_troubleshooting.py > docs/troubleshooting.md
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdboot.preflight.checks import AREAS  # noqa: E402
from pdboot.verify.diagnose import SIGNATURES  # noqa: E402

PREFLIGHT = ROOT / "pdboot" / "preflight"
ID_RE = re.compile(rf"^({'|'.join(AREAS)})\.[a-z_]+$")
# dotted names that are not check ids: the findings file, Docker Hub's registry
NOT_IDS = frozenset({"rdma.json", "docker.io"})
UNPARSED_FIX = "run the command on the host by hand and check the tool works"


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's NAME = "text" assignments (CHECK_ID, FIX_DRIVER, ...)."""
    out: dict[str, str] = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and len(n.targets) == 1:
            t, v = n.targets[0], n.value
            if isinstance(t, ast.Name):
                text = _text(v, out)
                if text is not None and "<" not in text:
                    out[t.id] = text
    return out


def _text(node: ast.expr, consts: dict[str, str]) -> str | None:
    """The text an expression prints, with <expression> for what is computed."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue):
                parts.append(f"<{ast.unparse(v.value)}>")
        return "".join(parts)
    if isinstance(node, ast.Name):
        return consts.get(node.id, f"<{node.id}>")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _text(node.left, consts), _text(node.right, consts)
        return None if a is None or b is None else a + b
    return f"<{ast.unparse(node)}>"


def _call_name(c: ast.Call) -> str:
    f = c.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def check_ids() -> set[str]:
    """Every check id the preflight code names (as a literal anywhere in pdboot/preflight/)."""
    out: set[str] = set()
    for path in PREFLIGHT.rglob("*.py"):
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and ID_RE.match(n.value):
                out.add(n.value)
    return out - NOT_IDS


def preflight_entries() -> dict[str, list[tuple[str, str, str]]]:
    """check id -> [(status, message, fix)] of every failure or warning its code prints
    with the id written out (an id passed in a variable gets an empty list)."""
    out: dict[str, list[tuple[str, str, str]]] = {i: [] for i in check_ids()}
    for path in sorted(PREFLIGHT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        consts = _constants(tree)
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call):
                continue
            name, args = _call_name(n), n.args
            if name == "CheckResult" and len(args) >= 3:
                cid, status = _text(args[0], consts), _text(args[1], consts)
                msg = _text(args[2], consts)
                fix = _text(args[3], consts) if len(args) > 3 else ""
            elif name == "_fail" and len(args) == 3:
                cid, status = _text(args[0], consts), "fail"
                msg, fix = _text(args[1], consts), _text(args[2], consts)
            elif name == "unparsed" and args:
                cid, status, fix = _text(args[0], consts), "fail", UNPARSED_FIX
                msg = "could not parse the output of a command"
            else:
                continue
            if cid is None or not ID_RE.match(cid):
                continue
            entries = out.setdefault(cid, [])
            if status in ("fail", "warn") and msg is not None:
                entry = (status, msg, fix or "")
                if entry not in entries:
                    entries.append(entry)
    return out


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    out = [
        "# Troubleshooting",
        "",
        "<!-- generated by scripts/gen_troubleshooting.py from pdboot/verify/diagnose.py and",
        "     pdboot/preflight/: do not edit, run"
        " `python3 scripts/gen_troubleshooting.py > docs/troubleshooting.md` -->",
        "",
        "Symptom -> cause -> fix, for the two places pdboot explains a failure:",
        "",
        "- [Failures in the logs](#failures-in-the-logs): what `pdboot up` (a failed start or",
        "  test request), `pdboot status` and `pdboot logs --diagnose` recognise in the",
        "  engines' and the router's logs; they print \"see docs/troubleshooting.md#log-ID\".",
        "- [Preflight checks](#preflight-checks): each check id of `pdboot preflight` (and of",
        "  the preflight `pdboot up` runs first), with the failures and warnings it reports.",
        "  Text in <angle brackets> is filled in at run time with what was found.",
        "",
        "## Failures in the logs",
        "",
    ]
    for s in SIGNATURES:
        out += [
            f'<a id="log-{s.id}"></a>',
            "",
            f"### log: {s.id}",
            "",
            f"- **Symptom**: a log line matching `{s.pattern.pattern}`"
            + (" (reported only when nothing more precise explains that log)" if s.broad else ""),
            f"- **Cause**: {s.cause}",
            f"- **Fix**: {s.fix}",
            "",
        ]
    out += ["## Preflight checks", ""]
    entries = preflight_entries()
    for cid in sorted(entries, key=lambda i: (AREAS.index(i.split(".")[0]), i)):
        out += [f'<a id="{cid}"></a>', "", f"### {cid}", ""]
        rows = entries[cid]
        if not rows:
            out += [
                "Its failures and warnings are worded at run time from what was found: the",
                "report's message names it and its fix says what to change.",
                "",
            ]
            continue
        out += ["| | symptom (the check's message) | fix |", "|---|---|---|"]
        for status, msg, fix in rows:
            out.append(f"| {status} | {_md(msg)} | {_md(fix) or '(the message says what)'} |")
        out.append("")
    out += [
        '<a id="area.evaluate"></a>',
        "",
        "### &lt;area&gt;.evaluate",
        "",
        "- **Symptom**: `internal error while judging <area>: <exception>`",
        "- **Cause**: a bug in pdboot: a parser or verdict raised on this host's output",
        "- **Fix**: report it with the output of the commands on that host",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
