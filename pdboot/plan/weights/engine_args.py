"""What the engines are told about the weights (pure; plan/build.py calls it).

A hub model pinned to a commit loads exactly that commit (`--revision`, and the same for
the tokenizer, which vLLM resolves on its own); with staging on, the files are already in
the host's cache, so the engine starts with HF_HUB_OFFLINE=1 and never asks the hub."""

from __future__ import annotations

from pdboot.inventory.schema import Weights
from pdboot.plan.weights.hub import is_commit, is_hub_model


def revision_args(model: str, revision: str) -> list[str]:
    if not is_hub_model(model) or revision == "main":
        return []  # vLLM's own default: no flag, the command stays as before
    return ["--revision", revision, "--tokenizer-revision", revision]


def revision_of(model: str, revision: str) -> str:
    """The --revision pdboot gives the engines ("" when none: vLLM's default branch). Not
    read back from the commands: a tier's extra_args may carry its own --revision."""
    args = revision_args(model, revision)
    return args[1] if args else ""


def engine_hub_env(model: str, revision: str, weights: Weights) -> dict[str, str]:
    if not is_hub_model(model):
        return {}
    env = {"HF_ENDPOINT": weights.endpoint} if weights.endpoint else {}
    if weights.stage and is_commit(revision):
        env["HF_HUB_OFFLINE"] = "1"  # staged: every file of this commit is in the cache
    return env
