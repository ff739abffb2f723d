"""The inventory's `kv_transfer` section: vLLM's KVTransferConfig fields an operator may set,
and pdboot's own keys beside them (RDMA choice, UCX settings)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, field_validator

from pdboot.inventory.safety import check_env_name
from pdboot.inventory.strict import Strict

# The fields of vLLM 0.33's KVTransferConfig that an operator may set. kv_role is set per
# tier by pdboot; engine_id is left to vLLM (a fresh uuid per engine).
KV_TRANSFER_FIELDS = (
    "kv_connector",
    "kv_buffer_device",
    "kv_load_failure_policy",
    "kv_connector_extra_config",
    "kv_connector_module_path",
    "enable_permute_local_kv",
    "kv_port",
)
# pdboot's own keys in the same section (never passed to vLLM).
KV_TRANSFER_PDBOOT_KEYS = ("rdma", "ucx")


class UCXSettings(Strict):
    net_devices: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_:,.-]+$")
    tls: str | None = Field(default=None, pattern=r"^\^?[A-Za-z0-9_:,.-]+$")  # UCX_TLS
    env: dict[str, str] = {}  # any other UCX_* variable

    @field_validator("env")
    @classmethod
    def _ucx_prefix(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            check_env_name(k)
        bad = [k for k in v if not k.startswith("UCX_")]
        if bad:
            raise ValueError(f"only UCX_* variables belong here, not {', '.join(sorted(bad))}")
        own = {"UCX_NET_DEVICES": "net_devices", "UCX_TLS": "tls"}
        for k in v:
            if k in own:
                raise ValueError(f"{k} has its own key: kv_transfer.ucx.{own[k]}")
        return v


class KVTransfer(Strict):
    kv_connector: Literal["NixlConnector", "NixlPushConnector"] = "NixlConnector"
    # None: the deployment's device (cuda, or cpu for `device: cpu`); see kv_buffer_device()
    kv_buffer_device: Literal["cuda", "cpu"] | None = None
    kv_load_failure_policy: Literal["fail", "recompute"] = "fail"
    kv_connector_extra_config: dict[str, Any] = {}
    kv_connector_module_path: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
    )
    enable_permute_local_kv: bool | None = None
    kv_port: int | None = Field(default=None, ge=1, le=65535)
    # the schema editors read says what the validator below accepts: YAML 1.1's on/off booleans
    rdma: Annotated[
        Literal["auto", "on", "off"],
        WithJsonSchema({"anyOf": [{"enum": ["auto", "on", "off"]}, {"type": "boolean"}]}),
    ] = "auto"
    ucx: UCXSettings = UCXSettings()
    # NIXL's own Prometheus exporter on every engine, on a port of its own (the HTTP port +
    # 1000; pdboot/plan/nixl_telemetry.py); false: no exporter, no port, no scrape target
    nixl_telemetry: bool = True

    @field_validator("rdma", mode="before")
    @classmethod
    def _yaml_on_off(cls, v: object) -> object:
        # YAML 1.1 reads an unquoted `on` / `off` as a boolean.
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v
