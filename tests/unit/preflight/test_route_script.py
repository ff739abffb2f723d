"""The route check's script (issue 18, item 14, the review's reproduction): the peer address is
quoted everywhere, run by real bash."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pdboot.preflight.checks import route


def test_route_script_quotes_the_peer_everywhere() -> None:
    evil = 'x"; touch /tmp/PWNED-route; echo "'
    script = route.script([evil])
    assert evil not in script.replace(f"'{evil}'", "")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    assert f"peer={evil}" in out.stdout
    assert not Path("/tmp/PWNED-route").exists()
