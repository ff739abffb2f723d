"""The inventory's ``watch`` section: how `pdboot watch` checks the deployment and acts
(docs/watch.md; the decisions: pdboot/plan/watch/policy.py)."""

from __future__ import annotations

from pydantic import Field, field_validator

from pdboot.inventory.imageref import IMAGE_CHARS_RE, check_image_reference
from pdboot.inventory.safety import check_safe_token
from pdboot.inventory.strict import Strict

DAY = 86400.0
_IMAGE_RE = IMAGE_CHARS_RE


class Watch(Strict):
    """`pdboot watch` (docs/watch.md): a canary through every prefill->decode pair each
    interval; a failing engine leaves the router and comes back after good canaries."""

    interval_seconds: float = Field(default=30.0, ge=0.5, le=DAY)
    deadline_seconds: float = Field(default=10.0, gt=0, le=3600)  # per canary step: a hang
    evict_after: int = Field(default=1, ge=1, le=1000)  # bad rounds in a row
    readmit_after: int = Field(default=3, ge=1, le=1000)  # good rounds in a row
    restart_after: int = Field(default=2, ge=1, le=1000)  # bad rounds (peer faults) in a row
    restart_backoff_seconds: float = Field(default=600.0, ge=0, le=7 * DAY)
    drain_seconds: float = Field(default=30.0, ge=0, le=DAY)
    # the last engine of a tier certainly at fault (its /health, or its own answer, failing)
    # leaves the router and the other tier serves alone as plain engines (degraded mode,
    # docs/watch.md); false: it stays (an alert)
    degraded: bool = True
    # its Prometheus metrics and last verdicts (/metrics, /verdicts) on the router host
    port: int = Field(default=29100, ge=1, le=65535)
    # where the service binds them: an address of the router host that Prometheus reaches
    # (e.g. a private or monitoring network's, or 127.0.0.1 behind a scraper on that host);
    # None: the router host's advertised address
    bind: str | None = Field(default=None, pattern=r"^[0-9A-Fa-f.:]{2,45}$")
    # `up` runs watch as a service beside the router from this image (pdboot installed:
    # containers/watch.Dockerfile); None: no service, run `pdboot watch` yourself
    image: str | None = None

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        # the safe-token check alone let "Bad/Img:1" through, which Docker refuses at the
        # pull (scripts/fuzz_sections.py found it): the reference grammar as `image` has
        if v is None:
            return None
        return check_image_reference(check_safe_token(v, "image reference", _IMAGE_RE))
