"""The hub's revision API, pure where it can be: the URL to ask, and what its answer means.

`GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true` answers the commit a branch or
tag points at and every file's size and hash (the same call huggingface_hub's `model_info`
makes with files_metadata=True): `lfs.sha256` for an LFS file, `blobId` (the git blob id,
sha1 of "blob <len>\\0" + content) for the others. Staging checks every file against it.
A 401/403 is a gated or private repository (without a token, or a token without access),
a 404 an unknown repository or revision: each becomes a `HubProblem` with its fix.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from pdboot.transport.http import HttpAnswer, HttpFn

DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
RESOLVE_TIMEOUT = 20.0


def is_commit(revision: str) -> bool:
    return bool(COMMIT_RE.match(revision))


def is_hub_model(model: str) -> bool:
    """A hub id (org/name), not a local absolute path."""
    return not model.startswith("/")


def hub_endpoint(configured: str | None, environ: Mapping[str, str] | None = None) -> str:
    """weights.endpoint, else $HF_ENDPOINT (a mirror) on the operator's machine, else the hub."""
    env = os.environ if environ is None else environ
    return (configured or env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def endpoint_refusal(endpoint: str, allow_plain_http: bool) -> str | None:
    """Why an endpoint is refused (None: fine). The token and the hashes every file is
    checked against travel on it: plain http only when the inventory says so by name."""
    scheme = urllib.parse.urlsplit(endpoint).scheme
    if scheme == "https" or (scheme == "http" and allow_plain_http):
        return None
    if scheme == "http":
        return (
            f"hub endpoint {endpoint} (weights.endpoint or $HF_ENDPOINT) is plain http: the "
            "token and the file hashes would cross the network readable and forgeable; use "
            "https://, or set weights.allow_plain_http: true for a mirror on a trusted network"
        )
    return f"hub endpoint {endpoint!r} is not an https:// URL"


def revision_url(endpoint: str, repo: str, revision: str) -> str:
    rev = urllib.parse.quote(revision, safe="")
    return f"{endpoint.rstrip('/')}/api/models/{repo}/revision/{rev}?blobs=true"


@dataclass(frozen=True)
class Resolution:
    repo: str
    revision: str  # what was asked (branch, tag or commit)
    commit: str
    files: tuple[tuple[str, int], ...]  # (path in repo, size in bytes)
    gated: bool = False
    # (path in repo, "sha256:<hex>" for an LFS file / "git:<hex>" its git blob id otherwise)
    hashes: tuple[tuple[str, str], ...] = ()

    @property
    def size(self) -> int:
        return sum(n for _, n in self.files)


@dataclass(frozen=True)
class HubProblem:
    # "auth" (401/403), "not_found" (404), "unreachable", "bad_answer", "insecure" (http)
    kind: str
    message: str
    fix: str


def parse_revision(
    answer: HttpAnswer, repo: str, revision: str, endpoint: str, has_token: bool
) -> Resolution | HubProblem:
    """The revision API's answer -> the commit and file sizes, or the problem with its fix."""
    where = f"{repo}@{revision} on {endpoint}"
    if answer.status == 0:
        return HubProblem(
            "unreachable",
            f"cannot reach the hub for {where}: {answer.error}",
            "check the network to the hub, or set weights.endpoint / HF_ENDPOINT to a mirror",
        )
    if answer.status in (401, 403):
        if not has_token:
            return HubProblem(
                "auth",
                f"{where}: HTTP {answer.status}, the repository is gated or private and no "
                "token is configured",
                "accept the model's licence on the hub, then set secrets.hf_token "
                "(env:HF_TOKEN or file:/path)",
            )
        return HubProblem(
            "auth",
            f"{where}: HTTP {answer.status}, the token in secrets.hf_token has no access",
            "request access to the model on the hub with the token's account, or use a "
            "token with read access to it",
        )
    if answer.status == 404:
        return HubProblem(
            "not_found",
            f"{where}: HTTP 404, no such repository or revision",
            "check `model` (org/name) and `model_revision` (a branch, tag or full commit)",
        )
    if answer.status != 200:
        return HubProblem(
            "unreachable",
            f"{where}: the hub answered HTTP {answer.status}",
            "retry later, or set weights.endpoint / HF_ENDPOINT to a mirror",
        )
    try:
        data = json.loads(answer.body)
        commit = str(data["sha"])
        siblings = data.get("siblings") or []
        files = tuple(
            (str(s["rfilename"]), int(s.get("size") or (s.get("lfs") or {}).get("size") or 0))
            for s in siblings
        )
        hashes = tuple((str(s["rfilename"]), file_hash(s)) for s in siblings)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return HubProblem(
            "bad_answer",
            f"{where}: unexpected answer from the revision API ({type(e).__name__}: {e})",
            "is weights.endpoint a Hugging Face compatible hub?",
        )
    if not is_commit(commit):
        return HubProblem(
            "bad_answer", f"{where}: the hub answered {commit!r}, not a commit hash", ""
        )
    unhashed = [f for f, h in hashes if not h]
    if unhashed:
        return HubProblem(
            "bad_answer",
            f"{where}: the revision API gave no sha256 / blob id for {', '.join(unhashed[:3])}",
            "every file is verified by hash: use a hub or mirror that answers ?blobs=true",
        )
    return Resolution(repo, revision, commit, files, bool(data.get("gated")), hashes)


HEX_RE = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def file_hash(sibling: Mapping[str, object]) -> str:
    """One sibling's expected hash ("" when the answer has none, or not a hex digest)."""
    lfs = sibling.get("lfs")
    if isinstance(lfs, Mapping):
        sha = str(lfs.get("sha256") or "").lower()
        return f"sha256:{sha}" if len(sha) == 64 and HEX_RE.match(sha) else ""
    oid = str(sibling.get("blobId") or "").lower()
    return f"git:{oid}" if len(oid) == 40 and HEX_RE.match(oid) else ""


def resolve(
    fetch: HttpFn,
    endpoint: str,
    repo: str,
    revision: str,
    token: str | None,
    allow_plain_http: bool = False,
) -> Resolution | HubProblem:
    """One question to the hub (from wherever pdboot runs); none to an endpoint refused."""
    refused = endpoint_refusal(endpoint, allow_plain_http)
    if refused is not None:
        return HubProblem("insecure", refused, "use an https:// hub or mirror")
    # bearer: sent to the endpoint only, never to a host a mirror redirects to
    answer = fetch(revision_url(endpoint, repo, revision), timeout=RESOLVE_TIMEOUT, bearer=token)
    return parse_revision(answer, repo, revision, endpoint, token is not None)


@dataclass(frozen=True)
class WeightsAsk:
    """What preflight checks about the weights on one engine host (plain values)."""

    model: str
    revision: str
    endpoint: str
    stage: bool
    lookup: Resolution | HubProblem | None = None  # the hub's answer, asked from here
    report_lookup: bool = False  # the first engine host carries the lookup's verdict

    @property
    def local(self) -> bool:
        return not is_hub_model(self.model)


def host_port(endpoint: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(endpoint)
    return u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
