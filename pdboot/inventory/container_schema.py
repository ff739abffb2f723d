"""`container`: the Docker settings every engine container gets (shared memory, ulimits,
the HF cache's host path, the restart policy)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pdboot.inventory.safety import check_abs_path, check_not_temp, check_size
from pdboot.inventory.strict import Strict

# /dev/shm of an engine is host memory: no host has more than a few TiB.
MAX_SHM_BYTES = 4 << 40


class Ulimits(Strict):
    # -1 = unlimited (RDMA memory registration needs it); else bytes up to the int64 max
    memlock: int = Field(default=-1, ge=-1, le=2**63 - 1)
    # The kernel's ceiling for open files (fs.nr_open max) is 2**30 - 64.
    nofile: int = Field(default=1048576, ge=1024, le=2**30)


class Container(Strict):
    shm_size: str = "16g"
    ulimits: Ulimits = Ulimits()
    hf_cache: str = "/var/lib/pdboot/hf-cache"  # host path, mounted at /root/.cache/huggingface
    restart: Literal["no", "on-failure", "unless-stopped", "always"] = "unless-stopped"

    @field_validator("restart", mode="before")
    @classmethod
    def _yaml_no(cls, v: object) -> object:
        # YAML 1.1 reads an unquoted `no` as false.
        return "no" if v is False else v

    @field_validator("shm_size")
    @classmethod
    def _size(cls, v: str) -> str:
        return check_size(v, "shm_size", MAX_SHM_BYTES)

    @field_validator("hf_cache")
    @classmethod
    def _cache(cls, v: str) -> str:
        return check_not_temp(check_abs_path(v, "hf_cache"), "hf_cache")
