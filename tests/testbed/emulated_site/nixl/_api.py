"""EMULATED nixl._api (see ../README.md): the calls vLLM's connector and pdboot's probe use."""

from __future__ import annotations

import mmap
import os

import _pdt_image

_MAPPED: list[mmap.mmap] = []  # kept open: a loaded module stays in /proc/self/maps
MODULE_DIR = "/tmp/pdt-ucx"


class nixl_agent_config:
    def __init__(
        self,
        enable_prog_thread: bool = True,
        enable_listen_thread: bool = False,
        listen_port: int = 0,
        backends: list[str] | None = None,
    ) -> None:
        self.backends = ["UCX"] if backends is None else backends


def _load_ucx_modules() -> None:
    """What creating a real UCX backend does: UCX dlopens its transport modules."""
    os.makedirs(MODULE_DIR, exist_ok=True)
    for name in _pdt_image.knob("uct_modules", _pdt_image.UCT_MODULES):
        path = os.path.join(MODULE_DIR, f"libuct_{name}.so")
        with open(path, "wb") as f:
            f.write(b"\0" * mmap.PAGESIZE)
        with open(path, "rb") as f:
            _MAPPED.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))


class nixl_agent:
    def __init__(
        self,
        agent_name: str,
        nixl_conf: nixl_agent_config | None = None,
        instantiate_all: bool = False,
    ) -> None:
        self.name = agent_name
        self.plugin_list = ["UCX"] if _pdt_image.knob("nixl", True) else []
        if not self.plugin_list:
            print("No plugins available, cannot start transfers!")
            raise RuntimeError("No plugins available for NIXL, cannot start transfers!")
        self.backends: dict[str, int] = {}
        for i, b in enumerate((nixl_conf or nixl_agent_config()).backends):
            if b not in self.plugin_list:
                print("Skipping backend registration", b, "due to the missing plugin.")
                continue
            _load_ucx_modules()
            self.backends[b] = i + 1
            print("Backend", b, "was instantiated")
        print("Initialized NIXL agent:", agent_name)

    def get_plugin_list(self) -> list[str]:
        return self.plugin_list
