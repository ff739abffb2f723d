"""The stand-in's weights, loaded honestly when a hub is in play (EMULATION of vLLM's
loader: the files are read and hashed, nothing is computed with them).

- a local absolute path, or no hub in the test (neither HF_HUB_OFFLINE nor HF_ENDPOINT
  set): nothing is loaded, as before (the stand-in needs no files);
- HF_HUB_OFFLINE=1: the REAL huggingface_hub client finds `--revision` in the HF cache
  (snapshot_download(local_files_only=True)); missing files fail the start the way vLLM
  does (an OSError naming the cache), never a download;
- HF_ENDPOINT set, online: the engine downloads the revision itself at start-up, as vLLM
  does without staging (what bench/weights.py compares staging against).
Then config.json, the tokenizer and every shard the safetensors index names are read.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

TRUE = ("1", "true", "yes", "on")


def load(
    args: Any, log: Callable[[str, str, str], None], die: Callable[[list[str]], Any]
) -> str | None:
    """The sha256 over the files loaded, or None when nothing is loaded."""
    model: str = args.model
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in TRUE
    if model.startswith("/") or not (offline or os.environ.get("HF_ENDPOINT")):
        return None
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        die(["  ...", f"ImportError: {e}"])
        return None
    try:
        path = snapshot_download(model, revision=args.revision, local_files_only=offline)
    except Exception as e:  # vLLM's start fails with the client's error
        die(["  ...", f"OSError: {type(e).__name__}: {e}"])
        return None
    names = ["config.json"]
    names += [
        n
        for n in ("tokenizer.json", "tokenizer_config.json")
        if os.path.exists(os.path.join(path, n))
    ]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        names += ["model.safetensors.index.json", *shards]
    elif os.path.exists(os.path.join(path, "model.safetensors")):
        names.append("model.safetensors")
    h = hashlib.sha256()
    for n in names:
        try:
            with open(os.path.join(path, n), "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except OSError as e:
            die(["  ...", f"OSError: {e}"])
    digest = h.hexdigest()
    commit = os.path.basename(os.path.realpath(path))
    log(
        "INFO",
        "weights_utils.py:1",
        f"STAND-IN loaded {len(names)} files of {model} at "
        f"{commit} (offline={offline}) sha256={digest[:16]}",
    )
    return digest
