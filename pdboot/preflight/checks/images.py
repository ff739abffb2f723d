"""Both images exist in their registry before anything is pulled.

The lookups themselves are ``pdboot.preflight.registry.lookup`` (made once per image from pdboot's
machine, see ``preflight.run.ImageLookups``); this module only judges them: a registry that
answers 404 for the manifest ("manifest unknown", "name unknown") has no such tag, and
``up`` would end at the pull -- a failure. A lookup that could not be made (no network,
credentials required, a timeout) proves nothing either way: a warning with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from pdboot.preflight.checks import CheckResult, HostContext, gib
from pdboot.preflight.registry import Lookup

ENGINE_ID = "docker.image_exists"
ROUTER_ID = "docker.router_image"
PROXY_ID = "docker.proxy_image"  # router.proxy_image: the nginx in front of the router


def verdict(check_id: str, image: str, key: str, look: Lookup) -> CheckResult:
    """One lookup -> pass / fail (no such tag) / warn (could not look). ``key``: the
    inventory key naming the image, for the fix."""
    if look.config is not None:
        cfg = look.config
        size = f", {gib(cfg.compressed_size)} to pull" if cfg.compressed_size else ""
        return CheckResult(
            check_id, "pass", f"{image} is in its registry ({cfg.os}/{cfg.architecture}{size})"
        )
    if look.missing:
        return CheckResult(
            check_id,
            "fail",
            f"{image}: {look.error}; `pdboot up` would fail at the pull",
            f"set `{key}` in the inventory to a tag the registry has (check the spelling "
            "and the registry's tag list), or push the image there",
        )
    return CheckResult(
        check_id,
        "warn",
        f"could not look {image} up before the pull: {look.error}",
        "make sure the hosts can pull it (`docker pull` on one host), or that pdboot's "
        "machine can reach the registry so preflight can check it",
    )


def evaluate(
    ctx: HostContext, looked: Mapping[str, Lookup], router_image: str, proxy_image: str = ""
) -> list[CheckResult]:
    """The image checks of one host: the engine image on engine hosts, the router image
    on the router host. An image that was not looked up (its area not selected) is not
    reported."""
    out: list[CheckResult] = []
    if ctx.gpu_host and ctx.image in looked:
        out.append(verdict(ENGINE_ID, ctx.image, "image", looked[ctx.image]))
    if "router" in ctx.roles and router_image in looked:
        out.append(verdict(ROUTER_ID, router_image, "router_image", looked[router_image]))
    if "router" in ctx.roles and proxy_image in looked:
        out.append(verdict(PROXY_ID, proxy_image, "router.proxy_image", looked[proxy_image]))
    return out
