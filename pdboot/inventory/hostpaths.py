"""Host paths that must never be bind-mounted into a container or made a project dir.

``container.hf_cache`` is mounted read-write (and created if missing), a model path
read-only, and ``remote_dir/name`` is where `up` writes and `down --purge` removes. An
exact-match deny-list let ``/var/run/docker.sock`` (root on the host to whoever reaches
it), ``/root/.ssh``, ``/var/lib/docker/volumes`` or ``/var/empty/sshd`` through: here
whole trees are refused by prefix, and a few names wherever they appear. The cross-field
rules keep the HF cache (which engines write) away from the project directory (which
holds secrets.env and is purged). Pure functions of plain strings.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

# Whole trees: runtime state, package databases, privilege-separation and spool dirs.
SENSITIVE_TREES = (
    "/run",
    "/var/run",
    "/var/empty",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/var/lib/containers",
    "/var/lib/kubelet",
    "/var/lib/dpkg",
    "/var/lib/apt",
    "/var/lib/rpm",
    "/var/lib/dnf",
    "/var/lib/yum",
    "/var/lib/systemd",
    "/var/lib/polkit-1",
    "/var/lib/sss",
    "/var/spool",
    "/var/log",
    "/var/mail",
    "/var/backups",
    "/snap",
    "/lost+found",
)
# Components that hold credentials wherever they are (~/.ssh, /etc/skel/.ssh, ...).
SECRET_COMPONENTS = frozenset((".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".netrc"))
SOCKET_SUFFIXES = (".sock", ".socket")


def within(path: str, tree: str) -> bool:
    """``path`` is ``tree`` or below it (both normalised absolute paths)."""
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def sensitive_reason(path: str) -> str | None:
    """Why ``path`` (normalised, absolute) must not be used; None when it may."""
    for tree in SENSITIVE_TREES:
        if within(path, tree):
            return f"is inside {tree}, which belongs to the system"
    parts = [p for p in path.split("/") if p]
    hit = next((p for p in parts if p in SECRET_COMPONENTS), None)
    if hit is not None:
        return f"is (inside) a {hit} directory, which holds credentials"
    if parts and parts[-1].endswith(SOCKET_SUFFIXES):
        return "names a socket (a docker/containerd socket is root on the host)"
    if len(parts) == 2 and parts[0] == "home":
        return "is a user's home directory"
    return None


def project_dir(remote_dir: str, name: str) -> str:
    return f"{remote_dir.rstrip('/')}/{name}"


def mount_conflicts(
    remote_dir: str, name: str, hf_cache: str, model_path: str | None
) -> Iterable[tuple[str, str]]:
    """(key, message) for host mounts that overlap pdboot's own directories."""
    pdir = project_dir(remote_dir, name)
    lock = f"{pdir}.lock"
    mounts = [("container.hf_cache", hf_cache, "read-write")]
    if model_path is not None:
        mounts.append(("model", model_path, "read-only"))
    for key, path, how in mounts:
        p = posixpath.normpath(path)
        if within(p, pdir) or within(p, lock) or p.startswith(f"{lock}."):
            yield (
                key,
                (
                    f"{path!r} is (inside) the deployment's project directory {pdir} "
                    f"(remote_dir/name): the containers would get secrets.env {how} and "
                    "`down --purge` would wipe it; use a directory outside it"
                ),
            )
        elif within(remote_dir, p):
            yield (
                key,
                (
                    f"{path!r} contains remote_dir {remote_dir}: every deployment's project "
                    f"directory, secrets.env included, would be mounted {how}; use a directory "
                    "of its own"
                ),
            )


__all__ = ["SENSITIVE_TREES", "mount_conflicts", "project_dir", "sensitive_reason", "within"]
