"""Reading (issue 18, item 11, the review's reproduction): an inventory that is a FIFO or a
directory is refused at once, never waited on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pdboot.inventory.load import InventoryError, load_inventory


@pytest.mark.timeout(20)
def test_a_fifo_inventory_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "inv.yaml"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(InventoryError, match="FIFO"):
        load_inventory(fifo)
    assert time.monotonic() - t0 < 5
    with pytest.raises(InventoryError, match="directory"):
        load_inventory(tmp_path)
