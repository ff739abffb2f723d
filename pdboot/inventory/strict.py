"""The base of every inventory model: strict pydantic (unknown keys are errors)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # strict: `port: yes` is a YAML bool, not the integer 1; no inf/nan for any number.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
