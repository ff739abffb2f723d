"""The inventory's ``weights`` section: how the model's files reach the engine hosts
(pdboot/plan/weights/, pdboot/deploy/weights/)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pdboot.inventory.imageref import IMAGE_CHARS_RE, check_image_reference
from pdboot.inventory.safety import check_safe_token
from pdboot.inventory.strict import Strict


class Weights(Strict):
    """How the model's files reach the engine hosts (deploy/weights/): staged once per host
    at the pinned commit before any engine starts (stage), or fetched by each engine itself
    at start-up (stage: false, vLLM's own download). seed first_host: download on the
    first engine host only and copy from it to the others over the hosts' own network."""

    stage: bool = True
    seed: Literal["none", "first_host"] = "none"
    seed_port: int = Field(default=8765, ge=1024, le=65535)  # the first host serves here
    # the hub (or a mirror); None: $HF_ENDPOINT on the operator's machine, else huggingface.co
    endpoint: str | None = Field(default=None, pattern=r"^https?://[A-Za-z0-9.:\[\]_-]+(/\S*)?$")
    # the token and the hashes every file is checked against come over it: https only,
    # unless plain http is wanted by name (a mirror on a trusted network; the testbed's hub)
    allow_plain_http: bool = False
    # the image staging runs in (containers/stage.Dockerfile: Python and huggingface_hub,
    # pulled in seconds), so that staging overlaps the engine image's pull; None: the
    # engine image's own huggingface_hub (staging then waits for that pull)
    image: str | None = None

    @field_validator("image")
    @classmethod
    def _stage_image(cls, v: str | None) -> str | None:
        if v is None:
            return None
        return check_image_reference(check_safe_token(v, "image reference", IMAGE_CHARS_RE))

    @model_validator(mode="after")
    def _https(self) -> Weights:
        plain = self.endpoint is not None and self.endpoint.startswith("http://")
        if plain and not self.allow_plain_http:
            raise ValueError(
                f"endpoint {self.endpoint} is plain http: the HF token and the file hashes "
                "would cross the network readable and forgeable; use https://, or set "
                "weights.allow_plain_http: true for a mirror on a trusted network"
            )
        return self
