"""What the engines are told about the weights (pure; plan/build.py calls it).

A hub model pinned to a commit loads exactly that commit (`--revision`, and the same for
the tokenizer, which vLLM resolves on its own); with staging on, the files are already in
the host's cache, so the engine starts with HF_HUB_OFFLINE=1 and never asks the hub."""

from __future__ import annotations

from pdboot.inventory.schema import Weights
from pdboot.plan.model import Plan
from pdboot.weights.hub import is_commit, is_hub_model


def revision_args(model: str, revision: str) -> list[str]:
    if not is_hub_model(model) or revision == "main":
        return []  # vLLM's own default: no flag, the command stays as before
    return ["--revision", revision, "--tokenizer-revision", revision]


def revision_of(plan: Plan) -> str:
    """The --revision the plan's engines get ("" when none: vLLM's default branch)."""
    for s in plan.services():
        args = list(s.command)
        if s.role != "router" and "--revision" in args[:-1]:
            return args[args.index("--revision") + 1]
    return ""


def engine_hub_env(model: str, revision: str, weights: Weights) -> dict[str, str]:
    if not is_hub_model(model):
        return {}
    env = {"HF_ENDPOINT": weights.endpoint} if weights.endpoint else {}
    if weights.stage and is_commit(revision):
        env["HF_HUB_OFFLINE"] = "1"  # staged: every file of this commit is in the cache
    return env
