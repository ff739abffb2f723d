"""The router's worker API as the testbed reaches it: from inside the router host, on its
loopback port (issue 28: the public port is the proxy's, which answers 404 to /workers)."""

from __future__ import annotations

import json
import sys
from typing import Any

_GET = """import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())
"""


def router_json(host: Any, path: str = "/workers", port: int = 8081) -> Any:
    """GET ``path`` on the router's loopback port of testbed ``host`` (a harness Host)."""
    res = host.exec([sys.executable, "-c", _GET, f"http://127.0.0.1:{port}{path}"])
    if res.returncode != 0:
        raise OSError(f"GET {path} on {host.name}: {res.stderr.strip()[-300:]}")
    return json.loads(res.stdout)
