"""`pdboot logs`' options as `docker compose logs` reads them: --since takes Go durations
(1h30m), RFC 3339 times with their zone and Unix seconds, and a refusal names those forms;
--tail takes a number or all; -t and -f exist for every service."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from pdboot.cli.operations import since_time, tail_lines
from tests.unit.cli.test_cli import ONE, run

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("value", "back"),
    [("1h30m", 5400), ("90s", 90), ("500ms", 0.5), ("1.5h", 5400), ("2d", 172800), ("1m30s", 90)],
)
def test_go_durations(value: str, back: float) -> None:
    assert since_time(value, NOW) == int(NOW - back)


@pytest.mark.parametrize(
    "value",
    ["2026-12-04T10:00:00Z", "2026-12-04T11:00:00+01:00", "2026-12-04t10:00:00.123456789z"],
)
def test_rfc3339_times(value: str) -> None:
    assert since_time(value, NOW) == int(datetime(2026, 12, 4, 10, tzinfo=timezone.utc).timestamp())


def test_unix_seconds() -> None:
    assert since_time("1764842400", NOW) == 1764842400


@pytest.mark.parametrize("value", ["yesterday", "10 minutes", "1x", "2026-12-04T10:00:00", ""])
def test_other_values_are_refused_naming_the_forms(value: str) -> None:
    with pytest.raises(ValueError, match=r"duration back from now .* RFC 3339 time .* Unix"):
        since_time(value, NOW)


def test_the_cli_refusal_names_the_forms_and_exits_2() -> None:
    code, out, err = run("logs", ONE, "decode", "--since", "yesterday")
    assert code == 2 and out == ""
    assert "--since 'yesterday': not a time: it takes a duration back from now (30s" in err
    assert "Invalid isoformat" not in err


def test_tail_takes_a_number_or_all() -> None:
    assert tail_lines("all") is None and tail_lines("ALL") is None and tail_lines("20") == 20
    for bad in ("-1", "x", "1.5"):
        with pytest.raises(ValueError):
            tail_lines(bad)
    code, _, err = run("logs", ONE, "decode", "--tail", "lots")
    assert code == 2 and "--tail 'lots': a number of lines, or all" in err


def test_timestamps_and_follow_are_options_of_logs() -> None:
    code, out, _ = run("logs", "--help")
    assert code == 0
    assert "--timestamps" in out and "-t" in out and "--follow" in out
    assert "(one service)" not in out
