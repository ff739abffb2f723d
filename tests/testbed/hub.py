"""A Hugging Face compatible hub for the testbed: a small HTTP server on the bridge address
(like the registry) serving small model repositories with the routes, headers and errors
the REAL huggingface_hub client uses, so that the client inside the engine image does the
downloads in the tests.

Routes (what huggingface_hub 2.x calls for snapshot_download / model_info):
- GET  /api/models/{repo}/revision/{rev}[?blobs=true]  model_info: sha, siblings (sizes)
- GET  /api/models/{repo}/tree/{rev}[/{path}]          list_repo_tree (one page)
- HEAD|GET /{repo}/resolve/{rev}/{path}                 a file, with ETag, X-Repo-Commit,
  X-Linked-Etag / X-Linked-Size (LFS files), Accept-Ranges; Range -> 206
- errors as the hub sends them: 401 (gated, no token; X-Error-Code: GatedRepo), 403 (a token
  without access), 404 (X-Error-Code: RepoNotFound / RevisionNotFound / EntryNotFound)
- POST /_pdt/move?repo=&branch=&commit=   the test moves a branch (not a hub route)
- POST /_pdt/rate?bps=N                   the test sets the per-client cap (0: none)
- POST /_pdt/tamper?repo=&file=[&off=1]    serve that file altered, at its size (a bad
  mirror), while the API keeps the true hashes; off=1 serves it true again

Every request is appended to the access log (JSON lines: client address, method, path,
status, body bytes sent, Range). --rate-bps caps each client address's download rate (a
token bucket shared by that client's connections), to make a slow WAN visible.

Run: python3 -m tests.testbed.hub --listen ADDR:PORT --log FILE [--rate-bps N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKEN = "hf_testbed_token_0123456789"
SHARD_BYTES = 3 * 1024 * 1024
PUBLIC_REPO = "pdt/tiny-model"
GATED_REPO = "pdt/gated-model"
HUGE_REPO = "pdt/huge-model"  # the revision API claims 100 TB (no disk holds it)


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _bytes(seed: str, n: int) -> bytes:
    out = bytearray()
    block = hashlib.sha256(seed.encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 32
    return bytes(out[:n])


def model_files(version: int, shard_bytes: int = SHARD_BYTES) -> dict[str, bytes]:
    """A tiny Llama-like repository: config, tokenizer, an index naming two shards."""
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    files = {
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "config.json": json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 512,
                "vocab_size": 1000,
                "torch_dtype": "bfloat16",
                "pdt_version": version,
            },
            indent=1,
        ).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "tokenizer_config.json": b'{"model_max_length": 4096}',
        "model.safetensors.index.json": json.dumps(
            {
                "metadata": {"total_size": 2 * shard_bytes},
                "weight_map": {"model.embed_tokens.weight": shards[0], "lm_head.weight": shards[1]},
            }
        ).encode(),
    }
    for i, s in enumerate(shards):
        # version 2 changes the second shard only (a new upload on the branch)
        files[s] = _bytes(f"shard{i}-v{version if i else 1}", shard_bytes)
    return files


def is_lfs(path: str) -> bool:
    return path.endswith(".safetensors")


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit
    gated: bool = False
    upcoming: dict[str, bytes] | None = None  # what `/_pdt/move ... commit=new` uploads
    claimed: dict[str, int] = field(default_factory=dict)  # sizes the API reports instead

    def add_commit(self, files: dict[str, bytes], branch: str = "main") -> str:
        h = hashlib.sha1()
        for k in sorted(files):
            h.update(k.encode() + b"\0" + git_oid(files[k]).encode())
        commit = h.hexdigest()
        self.commits[commit] = files
        self.refs[branch] = commit
        return commit

    def resolve(self, rev: str) -> str | None:
        if rev in self.commits:
            return rev
        return self.refs.get(rev)


def default_repos(shard_bytes: int = SHARD_BYTES) -> dict[str, Repo]:
    public = Repo()
    public.add_commit(model_files(1, shard_bytes), "v1")
    public.refs["main"] = public.refs["v1"]
    public.upcoming = model_files(2, shard_bytes)
    gated = Repo(gated=True)
    gated.add_commit(model_files(1, shard_bytes))
    huge = Repo(claimed={"model-00001-of-00002.safetensors": 100 * 10**12})
    huge.add_commit(model_files(1, shard_bytes))
    return {PUBLIC_REPO: public, GATED_REPO: gated, HUGE_REPO: huge}


class Bucket:
    """Per-client token bucket (bytes/s) shared by that client's connections."""

    def __init__(self, rate: float) -> None:
        self.rate, self.lock, self.next = rate, threading.Lock(), time.monotonic()

    def take(self, n: int) -> None:
        with self.lock:
            now = time.monotonic()
            self.next = max(self.next, now) + n / self.rate
            wait = self.next - now
        if wait > 0:
            time.sleep(wait)


class Hub:
    def __init__(self, repos: dict[str, Repo], log: Path, rate_bps: float = 0) -> None:
        self.repos, self.log, self.rate = repos, log, rate_bps
        self.buckets: dict[str, Bucket] = {}
        self.lock = threading.Lock()
        self.tampered: set[tuple[str, str]] = set()

    def bucket(self, client: str) -> Bucket | None:
        if self.rate <= 0:
            return None
        with self.lock:
            return self.buckets.setdefault(client, Bucket(self.rate))

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock, open(self.log, "a") as f:
            f.write(json.dumps(entry) + "\n")


API_REV = re.compile(r"^/api/models/([^/]+/[^/]+)/revision/([^/?]+)$")
API_TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/?]+)(?:/(.*))?$")
RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ------------------------------------------------------------------ plumbing
    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        ctype: str = "application/json",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        sent = 0
        if self.command != "HEAD":
            sent = self._write(body)
        self._log(status, sent, len(body))

    def _write(self, body: bytes) -> int:
        bucket = self.hub.bucket(self.client_address[0])
        sent = 0
        step = 64 * 1024
        try:
            for i in range(0, len(body), step):
                chunk = body[i : i + step]
                if bucket is not None:
                    bucket.take(len(chunk))
                self.wfile.write(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        return sent

    def _log(self, status: int, sent: int, length: int = 0) -> None:
        self.hub.record(
            {
                "t": round(time.time(), 3),
                "client": self.client_address[0],
                "method": self.command,
                "path": self.path,
                "status": status,
                "bytes": sent,
                "length": length,
                "range": self.headers.get("Range", ""),
                "auth": bool(self.headers.get("Authorization")),
            }
        )

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message})

    def _repo(self, name: str, rev: str) -> tuple[Repo, str] | None:
        repo = self.hub.repos.get(name)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
            return None
        if repo.gated:
            auth = self.headers.get("Authorization", "")
            if not auth:
                self._error(
                    401,
                    "GatedRepo",
                    f"Access to model {name} is restricted. You must "
                    "have access to it and be authenticated to access it. Please log in.",
                )
                return None
            if auth != f"Bearer {TOKEN}":
                self._error(
                    403,
                    "GatedRepo",
                    f"Access to model {name} is restricted and you are not in the authorized list.",
                )
                return None
        commit = repo.resolve(urllib.parse.unquote(rev))
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo, commit

    # ------------------------------------------------------------------ routes
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        if u.path == "/_pdt/move" and q.get("repo") in self.hub.repos:
            repo = self.hub.repos[q["repo"]]
            extra = repo.upcoming
            if q.get("commit") == "new" and extra is not None:
                commit = repo.add_commit(extra, q.get("branch", "main"))
            else:
                commit = q.get("commit", "")
                repo.refs[q.get("branch", "main")] = commit
            self._send(200, json.dumps({"commit": commit}).encode())
            return
        if u.path == "/_pdt/tamper":
            key = (q.get("repo", ""), q.get("file", ""))
            if q.get("off"):
                self.hub.tampered.discard(key)
            else:
                self.hub.tampered.add(key)
            self._send(200, json.dumps({"tampered": sorted(self.hub.tampered)}).encode())
            return
        if u.path == "/_pdt/rate":
            self.hub.rate = float(q.get("bps", "0"))
            with self.hub.lock:
                self.hub.buckets.clear()
            self._send(200, json.dumps({"bps": self.hub.rate}).encode())
            return
        self._error(404, "EntryNotFound", "no such route")

    def do_GET(self) -> None:
        u = urllib.parse.urlsplit(self.path)
        path = u.path
        if m := API_REV.match(path):
            self._revision(m.group(1), m.group(2), "blobs=true" in u.query)
        elif m := API_TREE.match(path):
            self._tree(m.group(1), m.group(2), m.group(3) or "")
        elif m := RESOLVE.match(path):
            self._resolve(m.group(1), m.group(2), urllib.parse.unquote(m.group(3)))
        elif path == "/api/health":
            self._send(200, b'{"ok":true}')
        else:
            self._error(404, "EntryNotFound", f"no route {path}")

    def _entry(self, name: str, data: bytes) -> dict[str, Any]:
        e: dict[str, Any] = {"type": "file", "path": name, "oid": git_oid(data), "size": len(data)}
        if is_lfs(name):
            e["lfs"] = {
                "oid": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "pointerSize": 134,
            }
        return e

    def _revision(self, name: str, rev: str, blobs: bool) -> None:
        got = self._repo(name, rev)
        if got is None:
            return
        repo, commit = got
        siblings = []
        for f, data in sorted(repo.commits[commit].items()):
            s: dict[str, Any] = {"rfilename": f}
            if blobs:
                s.update(size=repo.claimed.get(f, len(data)), blobId=git_oid(data))
                if is_lfs(f):
                    s["lfs"] = {
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": 134,
                    }
            siblings.append(s)
        body = {
            "_id": name,
            "id": name,
            "modelId": name,
            "sha": commit,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": [],
            "downloads": 0,
            "likes": 0,
            "siblings": siblings,
            "lastModified": "2026-01-01T00:00:00.000Z",
            "createdAt": "2026-01-01T00:00:00.000Z",
        }
        self._send(200, json.dumps(body).encode())

    def _tree(self, name: str, rev: str, sub: str) -> None:
        got = self._repo(name, rev)
        if got is None:
            return
        repo, commit = got
        files = repo.commits[commit]
        out = [
            self._entry(f, d)
            for f, d in sorted(files.items())
            if not sub or f.startswith(sub.rstrip("/") + "/")
        ]
        self._send(200, json.dumps(out).encode())

    def _resolve(self, name: str, rev: str, file: str) -> None:
        got = self._repo(name, rev)
        if got is None:
            return
        repo, commit = got
        data = repo.commits[commit].get(file)
        if data is None:
            self._error(404, "EntryNotFound", f"{file} does not exist on {rev}")
            return
        etag = hashlib.sha256(data).hexdigest() if is_lfs(file) else git_oid(data)
        headers = {"ETag": f'"{etag}"', "X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
        if is_lfs(file):
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
        if (name, file) in self.hub.tampered:  # the same size, one byte altered
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        status, body = 200, data
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if m:
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            if start >= len(data):
                self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                return
            status, body = 206, data[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{start + len(body) - 1}/{len(data)}"
        self._send(status, body, headers, "application/octet-stream")


def serve(listen: str, log: Path, rate_bps: float = 0, shard_bytes: int = SHARD_BYTES) -> None:
    host, _, port = listen.rpartition(":")
    Handler.hub = Hub(default_repos(shard_bytes), log, rate_bps)
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()


def read_log(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def downloads(log: Path, repo: str = PUBLIC_REPO) -> dict[tuple[str, str], int]:
    """(client, file) -> how many GETs of its resolve URL sent the whole answer (a file, or
    the Range asked); a transfer cut short (the client died) does not count."""
    out: dict[tuple[str, str], int] = {}
    for e in read_log(log):
        m = RESOLVE.match(urllib.parse.urlsplit(e["path"]).path)
        whole = e["bytes"] == e.get("length", e["bytes"])
        if (
            e["method"] == "GET"
            and m
            and m.group(1) == repo
            and e["status"] in (200, 206)
            and whole
        ):
            key = (e["client"], urllib.parse.unquote(m.group(3)))
            out[key] = out.get(key, 0) + 1
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--log", required=True, type=Path)
    p.add_argument("--rate-bps", type=float, default=0)
    p.add_argument("--shard-bytes", type=int, default=SHARD_BYTES)
    a = p.parse_args()
    serve(a.listen, a.log, a.rate_bps, a.shard_bytes)


if __name__ == "__main__":
    main()
