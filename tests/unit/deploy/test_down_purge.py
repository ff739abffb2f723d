"""`down --purge` removes only the images pdboot pulled (issue 32, item 1): the record of
pulls (pdboot/transport/pulled_record.py) and the purge that reads it. The testbed test
tests/e2e/test_up_status_down.py::test_purge_keeps_a_side_loaded_image shows it on real Docker."""

from __future__ import annotations

from pdboot.deploy.down import DownOptions
from pdboot.transport.pulled_record import parse_record, record_lines, to_purge
from tests.unit.orchestrator_fakes import FAKE_DIGEST, Recorder, World, inventory, run_down, run_up

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64


def test_record_round_trip_ignores_malformed_lines() -> None:
    text = record_lines([("reg/a:1", D1), ("reg/b:2", D2), ("bad image", D1), ("reg/c", "x")])
    assert text == f"reg/a:1 {D1}\nreg/b:2 {D2}\n"
    assert parse_record(text + "junk\n" + f"reg/a:1 {D1}\nreg/c:3 {D2} extra\n") == [
        ("reg/a:1", D1),
        ("reg/b:2", D2),
    ]
    assert parse_record(None) == []


def test_only_recorded_images_that_still_carry_the_pulled_digest_are_purged() -> None:
    record = [("reg/a:1", D1), ("reg/b:2", D1), ("reg/gone:1", D1)]
    local = {"reg/a:1": [D1, D2], "reg/b:2": [D2], "reg/gone:1": []}  # b replaced by hand
    assert to_purge(record, local) == ["reg/a:1"]


def test_purge_keeps_an_image_that_was_on_the_host_before_up() -> None:
    world = World(inventory())
    engine_image = world.inv.image
    world.side_loaded["d1"] = {engine_image}
    code, _ = run_up(world)
    assert code == 0
    assert world.pulled_record["p1"] == [(engine_image, FAKE_DIGEST)]
    assert "d1" not in world.pulled_record  # present already: not pdboot's
    rec = Recorder()
    assert run_down(world, rec, DownOptions(purge=True)) == 0
    removed = {(h, w) for op, h, w in world.calls if op == "remove_image"}
    assert ("p1", engine_image) in removed and ("r", world.inv.router_image) in removed
    assert not any(h == "d1" for h, _ in removed)
    assert any("d1: kept" in n.message and "not pulled by pdboot" in n.message for n in rec.events
               if hasattr(n, "message"))  # fmt: skip
