"""Test inventories pointing at a testbed (the YAML an operator would write, for our hosts).

Defaults: hosts named decode/prefill/ingress take those roles (else the first host decodes,
the second prefills, the last routes); images from the testbed's registry; ssh as root with
the testbed's key and known_hosts (strict checking stays on); ulimits lowered to what this
machine allows (memlock 8 MiB, nofile 20000: see the recipe's CAP_SYS_RESOURCE note);
requirements.min_free_disk_gb lowered (the machine's disk is shared by all test hosts).
`overrides` is deep-merged last, so a test can set anything (or break anything).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.testbed.profiles import deep_merge

if TYPE_CHECKING:
    from tests.testbed.harness import Testbed

TEST_MODEL = "Qwen/Qwen3-0.6B"


def inventory_dict(tb: Testbed, *, name: str = "pdtest", model: str = TEST_MODEL,
                   decode: list[str] | None = None, prefill: list[str] | None = None,
                   router: str | None = None,
                   overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    names = list(tb.hosts)
    decode = decode or (["decode"] if "decode" in tb.hosts else names[:1])
    prefill = prefill or (["prefill"] if "prefill" in tb.hosts else names[1:2] or names[:1])
    router = router or ("ingress" if "ingress" in tb.hosts else names[-1])
    inv: dict[str, Any] = {
        "name": name,
        "model": model,
        "image": tb.image,
        "router_image": tb.router_image,
        "ssh": {"user": "root", "identity_file": str(tb.identity_file),
                "known_hosts": str(tb.known_hosts), "use_ssh_config": False,
                "connect_timeout": 5},
        "hosts": {h.name: {"address": h.address} for h in tb.hosts.values()},
        "prefill": {"hosts": prefill},
        "decode": {"hosts": decode},
        "router": {"host": router},
        "container": {"ulimits": {"memlock": 8388608, "nofile": 20000}, "shm_size": "1g"},
        "requirements": {"min_free_disk_gb": 1},
        # TEST_MODEL is a name only: no hub serves it, the stand-in loads nothing (tests of
        # staging name tb.hub's repository and turn it on, tests/e2e/test_weights.py)
        "weights": {"stage": False},
        "timeouts": {"ready_seconds": 120, "router_ready_seconds": 60, "pull_seconds": 300,
                     "poll_interval_seconds": 0.2},
    }
    return deep_merge(inv, overrides or {})


def write_inventory(tb: Testbed, path: Path, **kw: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(inventory_dict(tb, **kw), sort_keys=False))
    return path
