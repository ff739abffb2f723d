"""What each container may do beyond an unprivileged process (issue 42, point 6): every one
runs with ``no-new-privileges`` (a setuid binary inside cannot gain more), and keeps only the
Linux capabilities its program uses. Docker's default set is CHOWN, DAC_OVERRIDE, FOWNER,
FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT, MKNOD,
AUDIT_WRITE and SETFCAP.

- the router (vllm-router): none. It binds ports above 1023, reads its environment and talks
  HTTP; it writes no file it does not own and starts no process as another user.
- the proxy (nginx): CHOWN, SETUID and SETGID (the master, root, makes its temp directories
  over to the image's `nginx` user and starts its workers as that user), DAC_OVERRIDE (the
  master reads the key's include and the TLS key, 0600 files owned by whoever `up` connects
  as), NET_BIND_SERVICE only when router.port is below 1024.
- the engines (vLLM): the file capabilities (CHOWN, DAC_OVERRIDE, FOWNER, FSETID: the HF cache
  and model mounts may belong to another user than the container's root, and vLLM and its
  libraries write caches there) and KILL (signals to its worker processes); with RDMA also
  IPC_LOCK (already added: registered memory is pinned). The rest of Docker's set is dropped:
  vLLM starts no setuid program, binds no port below 1024, sends no raw packets (UCX's TCP
  and RC transports use ordinary sockets and verbs), makes no device node and no chroot.
"""

from __future__ import annotations

NO_NEW_PRIVILEGES = "no-new-privileges:true"
ALL = "ALL"

PROXY_CAPS = ("CHOWN", "DAC_OVERRIDE", "SETGID", "SETUID")
ENGINE_DROPPED = (
    "AUDIT_WRITE",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
)


def proxy_caps(port: int) -> tuple[str, ...]:
    """The proxy's capabilities (after dropping ALL): a privileged port needs one more."""
    return tuple(sorted((*PROXY_CAPS, "NET_BIND_SERVICE"))) if port < 1024 else PROXY_CAPS
