"""What preflight asks from the operator's machine while the hosts run their scripts: each
engine image's config from its registry (``ImageLookups``) and the model's revision from the
hub (``HubLookup``), each on a daemon thread started before the hosts are connected to; and
how their answers enter a host's context (``with_lookup``, ``with_hub_answer``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Collection

from pdboot.inventory.schema import Inventory
from pdboot.plan.weights.hub import HubProblem, Resolution, hub_endpoint, is_hub_model
from pdboot.preflight import registry
from pdboot.preflight.checks import HostContext, ParseError, parse_sections
from pdboot.preflight.checks import docker as docker_checks
from pdboot.transport.http import http
from pdboot.transport.hub import RESOLVE_TIMEOUT, resolve
from pdboot.transport.masking import register_secret

# --------------------------------------------------------------------------- images

# A lookup is a few small GETs with TIMEOUT_S each; after the hosts have answered we wait
# at most this much longer for it (normally it finished long before).
LOOKUP_GRACE_S = 15.0
# Disk a pull takes, from the compressed layer sizes: the downloads are kept while they are
# unpacked, and gzip'd binaries unpack to about twice their size.
PULL_DISK_FACTOR = 3


class ImageLookups:
    """Each distinct engine image looked up once from this machine, on a daemon thread
    started before the hosts are connected to, so it costs no wall time."""

    def __init__(self, images: Collection[str]) -> None:
        self.results: dict[str, registry.Lookup] = {}
        self._threads: dict[str, threading.Thread] = {}
        for image in sorted(set(images)):
            t = threading.Thread(
                target=self._one, args=(image,), daemon=True, name="pdboot-registry"
            )
            self._threads[image] = t
            t.start()

    def _one(self, image: str, insecure: Collection[str] = ()) -> None:
        try:
            self.results[image] = registry.lookup(image, insecure=insecure)
        except Exception as e:  # a bug in the lookup must not read as a timeout
            self.results[image] = registry.Lookup(image, error=f"{type(e).__name__}: {e}")

    def wait(self, grace: float = LOOKUP_GRACE_S) -> dict[str, registry.Lookup]:
        end = time.monotonic() + grace
        for image, t in self._threads.items():
            t.join(max(0.0, end - time.monotonic()))
            if image not in self.results:
                self.results[image] = registry.Lookup(image, error="the lookup timed out")
        return dict(self.results)

    def retry_insecure(self, insecure: Collection[str]) -> None:
        """https failed and http was not allowed up front: the hosts' dockerd pulls this
        registry over http ("Insecure Registries"), so may we."""
        for image, look in list(self.results.items()):
            ref = registry.parse_reference(image) if look.tls_failed else None
            if ref and registry.allows_plain_http(ref.registry, insecure):
                self._one(image, insecure)


def insecure_registries(outputs: Collection[str]) -> set[str]:
    """Every registry some host's `docker info` lists as insecure."""
    out: set[str] = set()
    for text in outputs:
        info = parse_sections(text).get(docker_checks.INFO)
        if info is None:
            continue
        try:
            out.update(docker_checks.parse_info(info.output).insecure_registries)
        except ParseError:
            continue
    return out


def with_lookup(ctx: HostContext, look: registry.Lookup | None) -> HostContext:
    if look is None:
        return ctx
    size = ctx.image_size_bytes
    if look.config is not None and look.config.compressed_size > 0:
        size = look.config.compressed_size * PULL_DISK_FACTOR
    return dataclasses.replace(ctx, image_lookup=look, image_size_bytes=size)


# --------------------------------------------------------------------------- weights


class HubLookup:
    """The revision API, asked once from here while the hosts run their scripts."""

    def __init__(self, inv: Inventory, wanted: bool) -> None:
        self.answer: Resolution | HubProblem | None = None
        self.thread: threading.Thread | None = None
        if wanted and is_hub_model(inv.model) and inv.weights.stage:
            self.thread = threading.Thread(
                target=self._ask, args=(inv,), daemon=True, name="pdboot-hub"
            )
            self.thread.start()

    def _ask(self, inv: Inventory) -> None:
        # here, not at the top: transport.hosts brings the docker SDK, which preflight
        # does not use (a third of its imports)
        from pdboot.transport.hosts import SecretError, read_hf_token

        try:
            token = read_hf_token(inv.secrets.hf_token)
        except SecretError as e:
            self.answer = HubProblem("auth", f"secrets.hf_token: {e}", "fix the reference")
            return
        if token:
            register_secret(token)
        endpoint = hub_endpoint(inv.weights.endpoint)
        w = inv.weights
        self.answer = resolve(
            http, endpoint, inv.model, inv.model_revision, token, w.allow_plain_http
        )

    def wait(self) -> Resolution | HubProblem | None:
        if self.thread is not None:
            self.thread.join(RESOLVE_TIMEOUT + 5)
        return self.answer


def with_hub_answer(ctx: HostContext, answer: Resolution | HubProblem | None) -> HostContext:
    if ctx.weights is None:
        return ctx
    return dataclasses.replace(ctx, weights=dataclasses.replace(ctx.weights, lookup=answer))
