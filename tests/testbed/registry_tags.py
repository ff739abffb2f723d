"""A second tag for an image already in the testbed's registry, through the registry's own
HTTP API (Registry API v2: GET the manifest, PUT it under the new tag): no pull, no push of
layers. Tests use it for an image whose tag moved (a `nightly` that names no release)."""

from __future__ import annotations

import urllib.request

_MANIFESTS = (
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.oci.image.manifest.v1+json"
)


def retag(registry: str, repo: str, tag: str, new: str) -> None:
    """Put the manifest of repo:tag under a second tag."""
    base = f"http://{registry}/v2/{repo}/manifests"
    req = urllib.request.Request(f"{base}/{tag}", headers={"Accept": _MANIFESTS})
    with urllib.request.urlopen(req, timeout=30) as r:
        body, kind = r.read(), r.headers["Content-Type"]
    put = urllib.request.Request(
        f"{base}/{new}", data=body, method="PUT", headers={"Content-Type": kind}
    )
    with urllib.request.urlopen(put, timeout=30) as r:
        assert r.status == 201, r.status
