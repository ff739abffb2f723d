"""A local model path (absolute, bind-mounted into the engines), checked on every host:
complete (config, a tokenizer, every shard the safetensors index names) and the same on
every host (sizes, and a hash of the index plus config). Pure: the listing command's text
in, verdicts out; the command itself is `listing_command`."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
TOP_FILES = ("config.json", "model.safetensors.index.json", *TOKENIZER_FILES)
INDEX_MARK = "---pdboot-index---"


def listing_command(path: str) -> str:
    """`file SIZE NAME` per file that matters, `hash SHA256` of index + config, the index."""
    files = " ".join(TOP_FILES)
    return (
        f"cd {shlex.quote(path)} 2>/dev/null || {{ echo 'no such directory'; exit 3; }}; "
        f"for f in {files} *.safetensors; do "
        '[ -f "$f" ] && echo "file $(stat -L -c %s -- "$f") $f"; done; '
        'echo "hash $(cat config.json model.safetensors.index.json 2>/dev/null '
        "| sha256sum | cut -d' ' -f1)\"; "
        f"echo {INDEX_MARK}; cat model.safetensors.index.json 2>/dev/null; true"
    )


@dataclass(frozen=True)
class Listing:
    sizes: dict[str, int]
    digest: str  # sha256 of config.json + the index, as the host read them
    shards: tuple[str, ...]  # what the index names (or model.safetensors alone)
    index_error: str = ""

    def fingerprint(self) -> tuple[str, tuple[tuple[str, int], ...]]:
        return self.digest, tuple(sorted(self.sizes.items()))


def parse_listing(text: str) -> Listing:
    head, _, index = text.partition(INDEX_MARK)
    sizes: dict[str, int] = {}
    digest = ""
    for line in head.splitlines():
        parts = line.split(" ", 2)
        if parts[0] == "file" and len(parts) == 3 and parts[1].isdigit():
            sizes[parts[2]] = int(parts[1])
        elif parts[0] == "hash" and len(parts) >= 2:
            digest = parts[1]
    shards: tuple[str, ...] = ()
    error = ""
    if index.strip():
        try:
            shards = tuple(sorted(set(json.loads(index)["weight_map"].values())))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            error = f"model.safetensors.index.json does not parse ({type(e).__name__})"
    elif "model.safetensors" in sizes:
        shards = ("model.safetensors",)
    return Listing(sizes, digest, shards, error)


def missing(listing: Listing) -> list[str]:
    """What a loadable checkpoint lacks here (empty: complete)."""
    out = [] if "config.json" in listing.sizes else ["config.json"]
    if not any(t in listing.sizes for t in TOKENIZER_FILES):
        out.append("a tokenizer (tokenizer.json / tokenizer.model / tokenizer_config.json)")
    if listing.index_error:
        out.append(listing.index_error)
    elif not listing.shards:
        out.append("model.safetensors or model.safetensors.index.json")
    out += [s for s in listing.shards if listing.sizes.get(s, 0) <= 0]
    return out


def differing(listings: Mapping[str, Listing]) -> dict[str, str]:
    """Host -> how it differs from the others (the most common fingerprint is the
    reference; on a tie, the first host's in name order)."""
    if len(listings) < 2:
        return {}
    counts = Counter(lst.fingerprint() for lst in listings.values())
    first = listings[min(listings)].fingerprint()
    ref = max(counts, key=lambda f: (counts[f], f == first))
    ref_host = next(h for h in sorted(listings) if listings[h].fingerprint() == ref)
    ref_sizes = dict(ref[1])
    out: dict[str, str] = {}
    for host, lst in sorted(listings.items()):
        if lst.fingerprint() == ref:
            continue
        diffs = [
            f"{name} {lst.sizes.get(name, 'missing')} vs {ref_sizes.get(name, 'missing')} bytes"
            for name in sorted(set(lst.sizes) | set(ref_sizes))
            if lst.sizes.get(name) != ref_sizes.get(name)
        ]
        if lst.digest != ref[0]:
            diffs.insert(0, "config.json + index hash differs")
        out[host] = f"differs from {ref_host}: " + "; ".join(diffs[:4])
    return out
