"""The hub's revision API, the pure part: the URL to ask, and the values its answer becomes
(pdboot.transport.hub asks and parses the answer).

`GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true` answers the commit a branch or
tag points at and every file's size and hash (the same call huggingface_hub's `model_info`
makes with files_metadata=True): `lfs.sha256` for an LFS file, `blobId` (the git blob id,
sha1 of "blob <len>\\0" + content) for the others. Staging checks every file against it.
A 401/403 is a gated or private repository (without a token, or a token without access),
a 404 an unknown repository or revision: each becomes a `HubProblem` with its fix.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


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


HEX_RE = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def file_hash(sibling: Mapping[str, object]) -> str:
    """One sibling's expected hash ("" when the answer has none, or not a hex digest)."""
    lfs = sibling.get("lfs")
    if isinstance(lfs, Mapping):
        sha = str(lfs.get("sha256") or "").lower()
        return f"sha256:{sha}" if len(sha) == 64 and HEX_RE.match(sha) else ""
    oid = str(sibling.get("blobId") or "").lower()
    return f"git:{oid}" if len(oid) == 40 and HEX_RE.match(oid) else ""


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
