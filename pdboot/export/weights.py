"""The weights on a scheduler (pure): what `pdboot stage` does on SSH hosts, as a step the
exported files run before any engine starts, once per node (Slurm) or in an init container
before each engine (Kubernetes).

Export stays offline, so the commit is the inventory's own ``model_revision``: a branch or tag
names no commit until someone asks the hub, and two nodes asking at different times could
load two commits (prefill and decode split across revisions). Such a revision is refused,
with the fix, unless the operator asks for vLLM's own download at start (named unpinned in
the output).

The step runs the SAME staging program as `pdboot stage` (plan/weights/programs.py: the
image's huggingface_hub downloads the commit into the node's HF cache, then every file is
checked against the hub's sha256 / git blob id). `pdboot stage` gets that file list from the
hub on the operator's machine; an offline export cannot, so LISTING, run first in the same
Python process, asks the hub's revision API for it on the node (the answer for a commit never
changes; the same fields transport/hub.py reads) and hands it to the program as
PDBOOT_STAGE_FILES.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdboot.export.common import ExportError
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import HF_CACHE_IN_CONTAINER
from pdboot.plan.weights.hub import endpoint_refusal, hub_endpoint, is_commit, is_hub_model
from pdboot.plan.weights.programs import STAGE_SCRIPT

# The hub's file list for the commit (argv: repo commit), before STAGE_SCRIPT reads it from
# PDBOOT_STAGE_FILES. The token (HF_TOKEN, from the secrets) goes to the endpoint only, never
# to a host it redirects to. Reports as the program does (`PDBOOT-STAGE {json}` lines).
LISTING = r"""
def _pdboot_listing():
    import json, os, re, sys, urllib.parse, urllib.request
    def fail(message):
        print("PDBOOT-STAGE " + json.dumps({"kind": "error", "message": message}), flush=True)
        sys.exit(1)
    repo, commit = sys.argv[1], sys.argv[2]
    endpoint = os.environ["HF_ENDPOINT"].rstrip("/")
    url = "%s/api/models/%s/revision/%s?blobs=true" % (
        endpoint, repo, urllib.parse.quote(commit, safe=""))
    req = urllib.request.Request(url)
    token = os.environ.get("HF_TOKEN")
    if token:
        req.add_unredirected_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            data = json.load(r)
    except Exception as e:
        fail("the hub's file list of %s@%s (%s): %s" % (repo, commit, endpoint, e))
    if data.get("sha") != commit:
        fail("the hub answered commit %r for %s@%s" % (data.get("sha"), repo, commit))
    hexd = re.compile(r"^[0-9a-f]+$")
    files = []
    for s in data.get("siblings") or []:
        lfs = s.get("lfs")
        if isinstance(lfs, dict):
            kind, value, length = "sha256", str(lfs.get("sha256") or "").lower(), 64
        else:
            kind, value, length = "git", str(s.get("blobId") or "").lower(), 40
        if len(value) != length or not hexd.match(value):
            fail("the hub gave no %s for %s: every file is verified by hash" % (
                kind, s.get("rfilename")))
        size = int(s.get("size") or (lfs or {}).get("size") or 0)
        files.append([str(s["rfilename"]), size, "%s:%s" % (kind, value)])
    os.environ["PDBOOT_STAGE_FILES"] = json.dumps(files)
_pdboot_listing()
"""

# What the step runs: python3 -c STAGE_PROGRAM REPO COMMIT
STAGE_PROGRAM = LISTING + STAGE_SCRIPT


@dataclass(frozen=True)
class WeightsStep:
    """Stage ``repo`` at ``commit`` into each node's HF cache (the engines' bind mount)."""

    repo: str
    commit: str
    image: str  # weights.image, else the engine image
    endpoint: str
    hf_cache: str  # on the node

    def command(self) -> list[str]:
        return ["python3", "-c", STAGE_PROGRAM, self.repo, self.commit]

    def environment(self) -> list[tuple[str, str]]:
        """As `pdboot stage`'s container (deploy/weights/staging.py), no secret in it."""
        return [
            ("HF_HOME", HF_CACHE_IN_CONTAINER),
            ("HF_ENDPOINT", self.endpoint),
            ("HF_HUB_DISABLE_TELEMETRY", "1"),
            ("PYTHONUNBUFFERED", "1"),
        ]


@dataclass(frozen=True)
class ExportWeights:
    """The inventory the plan is built from (its endpoint spelled out, as `up` plans a pinned
    deployment), the step (None: nothing to stage) and a line for the files' header."""

    inventory: Inventory
    step: WeightsStep | None
    summary: str
    unpinned: bool = False


def export_weights(inv: Inventory, download_at_start: bool = False) -> ExportWeights:
    """Raises ExportError for a hub model at a branch or tag without ``download_at_start``,
    and for an endpoint `pdboot stage` would refuse."""
    model, rev = inv.model, inv.model_revision
    if not is_hub_model(model):
        return ExportWeights(inv, None, f"weights: {model}, a path on the nodes (not staged)")
    if not is_commit(rev):
        if not download_at_start:
            raise ExportError(
                f"model_revision {rev!r} of {model} is a branch or tag, not a commit: the "
                "nodes could load different commits. Pin a commit in model_revision (`pdboot "
                "up --plan INVENTORY` shows the commit it names now), or pass "
                "--download-at-start to let vLLM download it on each node at start (unpinned)"
            )
        return ExportWeights(
            inv,
            None,
            f"weights: UNPINNED: {model}@{rev} is a branch or tag; each engine downloads "
            "what it names when it starts (vLLM's own download, --download-at-start)",
            unpinned=True,
        )
    if not inv.weights.stage:
        return ExportWeights(
            inv,
            None,
            f"weights: {model}@{rev}, downloaded by each engine at start (weights.stage: false)",
        )
    endpoint = hub_endpoint(inv.weights.endpoint)
    refused = endpoint_refusal(endpoint, inv.weights.allow_plain_http)
    if refused is not None:
        raise ExportError(refused)
    weights = inv.weights.model_copy(update={"endpoint": endpoint})
    pinned = inv.model_copy(update={"weights": weights})
    step = WeightsStep(model, rev, inv.weights.image or inv.image, endpoint, inv.container.hf_cache)
    return ExportWeights(
        pinned, step, f"weights: {model}@{rev}, staged and hash-checked on each node first"
    )
