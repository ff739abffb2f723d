"""What an image needs, read from its registry before anything is pulled.

A CUDA image carries its CUDA version in its config (``CUDA_VERSION``,
``NVIDIA_REQUIRE_CUDA``), so the oldest driver that can run it is known from two small
GETs of the Registry HTTP API v2 (the manifest, then the config blob) -- long before a
20 GB pull would end in "CUDA driver version is insufficient".

HTTP goes through transport/http.py's ``request``. The pure parts -- reference parsing,
``WWW-Authenticate`` parsing, platform selection in a manifest list / OCI index, env
extraction -- are plain functions; ``lookup`` does the I/O and turns every failure into a
reason string, never an exception.
"""

from __future__ import annotations

import ipaddress
import json
import re
import urllib.parse
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdboot.transport.http import RawAnswer, request

DOCKER_HUB = "registry-1.docker.io"
_HUB_NAMES = ("docker.io", "index.docker.io", "registry-1.docker.io")

MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ACCEPT = ", ".join((OCI_INDEX, MANIFEST_LIST, OCI_MANIFEST, DOCKER_MANIFEST))
INDEX_TYPES = (MANIFEST_LIST, OCI_INDEX)

TIMEOUT_S = 5.0
MAX_DOC_BYTES = 4 << 20  # manifests and configs are kilobytes; refuse anything absurd


class RegistryError(Exception):
    """A lookup step failed; the message is the reason shown to the operator."""


# --------------------------------------------------------------------------- references


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port] the API is served on (docker.io -> registry-1.docker.io)
    repository: str  # library/ubuntu, vllm/vllm-openai
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        """What goes after /manifests/: the digest wins over the tag, as in docker pull."""
        return self.digest or self.tag or "latest"

    @property
    def host(self) -> str:
        """The registry's host name or address without the port ([v6] unbracketed)."""
        h = self.registry
        if h.startswith("["):
            return h[1 : h.index("]")]
        return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


_DIGEST_RE = re.compile(r"^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,}$")


def parse_reference(image: str) -> ImageRef:
    """Docker's normalisation: ``ubuntu`` -> registry-1.docker.io, library/ubuntu, latest;
    the first path part is a registry only when it has a '.' or ':' or is 'localhost'."""
    text = image.strip()
    if not text or any(c.isspace() for c in text):
        raise RegistryError(f"not an image reference: {image!r}")
    name, _, digest = text.partition("@")
    if digest and not _DIGEST_RE.match(digest):
        raise RegistryError(f"bad digest in {image!r}")
    tag: str | None = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
        if not tag:
            raise RegistryError(f"empty tag in {image!r}")
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, repo = first, rest
    else:
        registry, repo = "docker.io", name
    if registry in _HUB_NAMES:
        registry = DOCKER_HUB
        if "/" not in repo:
            repo = f"library/{repo}"
    if not repo or repo != repo.lower() or "//" in repo or repo.endswith("/"):
        raise RegistryError(f"bad repository in {image!r}")
    if tag is None and not digest:
        tag = "latest"
    return ImageRef(registry, repo, tag, digest or None)


# --------------------------------------------------------------------------- auth


_PARAM_RE = re.compile(r'([A-Za-z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


def parse_www_authenticate(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="https://auth.docker.io/token",service="registry.docker.io",...`` ->
    ("bearer", {"realm": ..., "service": ..., "scope": ...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {
        m.group(1).lower(): m.group(2).replace('\\"', '"') if m.group(2) is not None else m.group(3)
        for m in _PARAM_RE.finditer(rest)
    }
    return scheme.lower(), params


def token_url(params: Mapping[str, str], repository: str) -> str:
    """The anonymous token request for pulling ``repository``."""
    realm = params.get("realm", "")
    if not realm.startswith(("https://", "http://")):
        raise RegistryError(f"the registry's auth challenge has no usable realm ({realm!r})")
    query = {"scope": params.get("scope") or f"repository:{repository}:pull"}
    if params.get("service"):
        query["service"] = params["service"]
    sep = "&" if "?" in realm else "?"
    return realm + sep + urllib.parse.urlencode(query)


# --------------------------------------------------------------------------- manifests


def select_manifest(index: Mapping[str, Any], platform: str = "linux/amd64") -> str:
    """The digest of ``platform`` ("os/arch[/variant]") in a manifest list or OCI index.
    Attestation entries (platform unknown/unknown) never match."""
    os_, _, arch_variant = platform.partition("/")
    arch, _, variant = arch_variant.partition("/")
    entries = index.get("manifests")
    if not isinstance(entries, list):
        raise RegistryError("the manifest list has no 'manifests'")
    seen: list[str] = []
    for m in entries:
        if not isinstance(m, dict):
            continue
        p = m.get("platform") or {}
        if not isinstance(p, dict):
            continue
        here = f"{p.get('os')}/{p.get('architecture')}" + (
            f"/{p['variant']}" if p.get("variant") else ""
        )
        seen.append(here)
        if p.get("os") == os_ and p.get("architecture") == arch:
            if variant and p.get("variant") not in (variant, None):
                continue
            digest = m.get("digest")
            if isinstance(digest, str) and digest:
                return digest
    have = ", ".join(s for s in seen if not s.startswith("unknown")) or "none"
    raise RegistryError(f"no {platform} image in the manifest list (platforms: {have})")


def config_digest(manifest: Mapping[str, Any]) -> str:
    cfg = manifest.get("config")
    digest = cfg.get("digest") if isinstance(cfg, dict) else None
    if not isinstance(digest, str) or not digest:
        raise RegistryError("the image manifest has no config digest")
    return digest


def layers_size(manifest: Mapping[str, Any]) -> int:
    """Compressed bytes a pull downloads: the sum of the layer sizes."""
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise RegistryError("the image manifest has no 'layers'")
    return sum(int(x.get("size") or 0) for x in layers if isinstance(x, dict))


def env_map(config: Mapping[str, Any]) -> dict[str, str]:
    """The image config's ``config.Env`` ("K=V" strings) as a dict."""
    inner = config.get("config")
    env = inner.get("Env") if isinstance(inner, dict) else None
    out: dict[str, str] = {}
    for item in env if isinstance(env, list) else []:
        key, sep, val = str(item).partition("=")
        if sep:
            out[key] = val
    return out


@dataclass(frozen=True)
class ImageConfig:
    image: str
    digest: str  # the platform's image manifest digest
    architecture: str
    os: str
    compressed_size: int
    env: Mapping[str, str] = field(default_factory=dict)
    scheme: str = "https"

    @property
    def cuda_version(self) -> str | None:
        return self.env.get("CUDA_VERSION") or None

    @property
    def require_cuda(self) -> str | None:
        return self.env.get("NVIDIA_REQUIRE_CUDA") or None


@dataclass(frozen=True)
class Lookup:
    """The outcome of one lookup: the config, or why there is none."""

    image: str
    config: ImageConfig | None = None
    error: str = ""
    tls_failed: bool = False  # https did not work and plain http was not allowed
    # the registry answered 404 for the manifest: the tag (or repository) does not exist,
    # as opposed to a lookup that could not be made (no network, auth, timeout)
    missing: bool = False


# --------------------------------------------------------------------------- plain http


def allows_plain_http(registry: str, insecure: Collection[str] = ()) -> bool:
    """Whether https may fall back to http for ``registry``.

    dockerd itself pulls over plain http only from registries in its "Insecure Registries"
    (names or CIDRs, 127.0.0.0/8 by default). pdboot looks the image up from its own machine
    while the hosts are still being connected to, so it cannot wait for their ``docker info``;
    it allows http up front for loopback and private addresses (a lab registry, never a
    public one), and the caller may pass the hosts' insecure list for a retry.
    """
    ref = ImageRef(registry, "x", None, None)
    host = ref.host
    if registry in insecure or host in insecure:
        return True
    if host == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if addr.is_loopback or addr.is_private:
        return True
    for net in insecure:
        try:
            if addr in ipaddress.ip_network(net, strict=False):
                return True
        except ValueError:
            continue
    return False


# --------------------------------------------------------------------------- I/O


class _Refused(Exception):
    """The registry answered with an HTTP error (``status`` >= 400)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class _Client:
    def __init__(self, ref: ImageRef, plain_http_ok: bool, timeout: float) -> None:
        self.ref = ref
        self.plain_http_ok = plain_http_ok
        self.timeout = timeout
        self.scheme = "https"
        self.token: str | None = None
        self.tls_failed = False

    def _open(self, url: str, accept: str, token: str | None) -> RawAnswer:
        # url: always http(s), built here or from a realm checked by token_url
        a = request(
            url,
            timeout=self.timeout,
            headers={"Accept": accept},
            bearer=token,
            max_bytes=MAX_DOC_BYTES,
        )
        if a.no_answer == "io":
            raise RegistryError(f"{self.ref.registry}: {a.error}")
        if len(a.body) > MAX_DOC_BYTES:
            raise RegistryError(f"{url}: response larger than {MAX_DOC_BYTES} bytes")
        return a

    def _ok(self, a: RawAnswer) -> tuple[bytes, Mapping[str, str]]:
        if a.status >= 400:
            raise _Refused(a.status)
        return a.body, a.headers

    def get(self, path: str, accept: str) -> tuple[bytes, Mapping[str, str]]:
        url = f"{self.scheme}://{self.ref.registry}/v2/{self.ref.repository}/{path}"
        a = self._open(url, accept, self.token)
        if a.no_answer == "connect":
            if self.scheme == "https" and self.plain_http_ok:
                self.scheme = "http"
                return self.get(path, accept)
            if self.scheme == "https":
                self.tls_failed = True
            raise RegistryError(f"cannot reach {url}: {a.error}")
        if a.status != 401 or self.token is not None:
            return self._ok(a)
        scheme, params = parse_www_authenticate(a.headers.get("www-authenticate", ""))
        if scheme != "bearer":
            raise RegistryError(
                f"{self.ref.registry} asks for {scheme or 'unknown'} credentials "
                "(a private repository?)"
            )
        tok = self._open(token_url(params, self.ref.repository), "application/json", None)
        if tok.no_answer:
            raise RegistryError(f"{self.ref.registry}: {tok.error}")
        doc = _json(self._ok(tok)[0], "token response")
        token = doc.get("token") or doc.get("access_token")
        if not isinstance(token, str) or not token:
            raise RegistryError("the registry's token endpoint returned no token")
        self.token = token
        a = self._open(url, accept, token)
        if a.no_answer:
            raise RegistryError(f"{self.ref.registry}: {a.error}")
        return self._ok(a)


def _json(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RegistryError(f"the {what} is not JSON") from None
    if not isinstance(doc, dict):
        raise RegistryError(f"the {what} is not a JSON object")
    return doc


def _http_reason(code: int, ref: ImageRef, what: str) -> str:
    if code == 404:
        return f"{what} not found in {ref.registry}/{ref.repository} (no such tag or repository)"
    if code in (401, 403):
        return f"{ref.registry} refused anonymous access to {ref.repository} (HTTP {code})"
    if code == 429:
        return f"{ref.registry} rate-limited the lookup (HTTP 429)"
    return f"{ref.registry} answered HTTP {code} for the {what}"


def lookup(
    image: str,
    *,
    platform: str = "linux/amd64",
    insecure: Collection[str] = (),
    timeout: float = TIMEOUT_S,
) -> Lookup:
    """Fetch ``image``'s manifest (picking ``platform`` from a list/index) and config.
    Never raises: a failure is ``Lookup.error``."""
    try:
        ref = parse_reference(image)
    except RegistryError as e:
        return Lookup(image, error=str(e))
    client = _Client(ref, allows_plain_http(ref.registry, insecure), timeout)
    what = f"manifest {ref.reference}"
    try:
        body, headers = client.get(f"manifests/{ref.reference}", ACCEPT)
        doc = _json(body, "manifest")
        digest = headers.get("docker-content-digest", ref.digest or "")
        media = str(doc.get("mediaType") or headers.get("content-type", "")).split(";")[0]
        if media in INDEX_TYPES or ("manifests" in doc and "layers" not in doc):
            digest = select_manifest(doc, platform)
            what = f"{platform} manifest {digest}"
            body, _ = client.get(f"manifests/{digest}", ACCEPT)
            doc = _json(body, "image manifest")
        if doc.get("schemaVersion") == 1:
            raise RegistryError("the registry serves a schema 1 manifest (unsupported, legacy)")
        cfg_digest = config_digest(doc)
        size = layers_size(doc)
        what = f"config blob {cfg_digest}"
        body, _ = client.get(f"blobs/{cfg_digest}", "application/json, */*")
        cfg = _json(body, "image config")
    except RegistryError as e:
        return Lookup(image, error=str(e), tls_failed=client.tls_failed)
    except _Refused as e:
        # 404 MANIFEST_UNKNOWN / NAME_UNKNOWN (distribution spec); a blob 404 is the
        # registry's own trouble, not a missing tag
        missing = e.status == 404 and not what.startswith("config blob")
        return Lookup(image, error=_http_reason(e.status, ref, what), missing=missing)
    return Lookup(
        image,
        ImageConfig(
            image=image,
            digest=digest,
            architecture=str(cfg.get("architecture") or ""),
            os=str(cfg.get("os") or ""),
            compressed_size=size,
            env=env_map(cfg),
            scheme=client.scheme,
        ),
    )
