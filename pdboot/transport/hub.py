"""One question to the hub's revision API, from wherever pdboot runs, and what its answer
means: the commit and every file's size and hash, or a `HubProblem` with its fix (the URL and
the values are pdboot.plan.weights.hub's)."""

from __future__ import annotations

import json

from pdboot.plan.weights.hub import (
    HubProblem,
    Resolution,
    endpoint_refusal,
    file_hash,
    is_commit,
    revision_url,
)
from pdboot.transport.http import HttpAnswer, HttpFn

RESOLVE_TIMEOUT = 20.0


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
