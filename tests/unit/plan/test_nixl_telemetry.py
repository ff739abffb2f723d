"""NIXL's own telemetry on every engine: the variables, the exporter and the metric names are
the NIXL wheel's (fixtures/nixl-1.5.1-telemetry/: the wheel in the vLLM CPU image, and a live
scrape of it); each engine gets a port of its own (HTTP + 1000, never 9090) that the load-time
rules keep apart from every other listener, preflight checks free, and the scrape config
reads; kv_transfer.nixl_telemetry: false leaves all of it out."""

from __future__ import annotations

import pytest

from pdboot.inventory.engines import NIXL_TELEMETRY_OFFSET, nixl_telemetry_port
from pdboot.inventory.load import InventoryError
from pdboot.plan import nixl_telemetry as nt
from pdboot.plan.build import build_plan
from pdboot.plan.prometheus import scrape_config
from pdboot.preflight.checks import parse_sections
from pdboot.preflight.contexts import contexts
from pdboot.verify.exposition import parse_exposition
from tests.unit.builders import inventory
from tests.unit.paths import FIXTURES

NIXL = FIXTURES / "nixl-1.5.1-telemetry"
WHEEL = parse_sections((NIXL / "wheel-strings.txt").read_text())
PLUGIN_STRINGS = next(v.output for k, v in WHEEL.items() if "prometheus_mp.so | grep -oE" in k)
LIBNIXL_STRINGS = next(v.output for k, v in WHEEL.items() if "libnixl.so" in k)
FILES = next(v.output for k, v in WHEEL.items() if k.startswith("unzip -l"))
TWO_RANKS = parse_exposition((NIXL / "prometheus_mp-two-ranks.txt").read_text())

TWO_PER_HOST = {"prefill.engines_per_host": 2, "decode.engines_per_host": 2}


def _env(svc: object) -> dict[str, str]:
    return dict(svc.environment)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the wheel's names


def test_the_exporter_is_a_plugin_the_wheel_ships() -> None:
    assert f"libtelemetry_exporter_{nt.EXPORTER}.so" in FILES


def test_every_variable_pdboot_sets_is_one_the_wheel_reads() -> None:
    names = set(PLUGIN_STRINGS.split()) | set(LIBNIXL_STRINGS.split())
    for key in nt.telemetry_env(9201):
        if key == "NIXL_TELEMETRY_ENABLE":  # the compiler split it (README): both halves there
            assert {"NIXL_TELEMETRY_ENIXL_ERR_NOT_POS", "Y_ENABLE"} & names
            assert any(n.startswith("NIXL_TELEMETRY_E") for n in names)
        else:
            assert key in names, key


def test_the_metrics_pdboot_relies_on_are_in_the_live_scrape() -> None:
    families = {s.name.removesuffix("_bucket") for s in TWO_RANKS}
    assert set(nt.METRICS) <= families
    # two ranks, one port: each rank is its own series, told apart by pid and local_rank
    errors = [s for s in TWO_RANKS if s.name == "agent_errors_total"]
    assert {s.labels["local_rank"] for s in errors} == {"0", "1"}
    assert {"backend", "remote_disconnect", "not_found"} <= {s.labels["status"] for s in errors}


# --------------------------------------------------------------------------- the plan


def test_every_engine_gets_the_exporter_on_its_own_port() -> None:
    plan = build_plan(inventory(overrides=TWO_PER_HOST))
    ports = {}
    for s in plan.engines:
        env = _env(s)
        assert env["NIXL_TELEMETRY_ENABLE"] == "y"
        assert env["NIXL_TELEMETRY_EXPORTER"] == "prometheus_mp"
        assert env["NIXL_TELEMETRY_MULTIPROC_DIR"] == nt.MULTIPROC_DIR
        port = int(env["NIXL_TELEMETRY_PROMETHEUS_PORT"])
        assert port == s.nixl_telemetry_port == s.port + NIXL_TELEMETRY_OFFSET
        ports[s.key] = port
    assert ports == {
        "prefill@p1": 9200,
        "prefill-1@p1": 9210,
        "decode@d1": 9201,
        "decode-1@d1": 9211,
    }


def test_never_9090_prometheus_own_port() -> None:
    inv = inventory(overrides={"prefill.port": 8090})
    assert nixl_telemetry_port(inv, 8090) == 9095
    assert _env(build_plan(inv).prefill_engines[0])["NIXL_TELEMETRY_PROMETHEUS_PORT"] == "9095"


def test_the_scrape_config_reads_every_engines_exporter() -> None:
    plan = build_plan(inventory(overrides=TWO_PER_HOST))
    jobs = {j["job_name"]: j["static_configs"] for j in scrape_config(plan)["scrape_configs"]}
    nixl = jobs["demo-nixl"]
    assert sorted(g["targets"][0] for g in nixl) == [
        "192.0.2.10:9200",
        "192.0.2.10:9210",
        "192.0.2.11:9201",
        "192.0.2.11:9211",
    ]
    assert {g["labels"]["service"] for g in nixl} == {s.key for s in plan.engines}
    assert all(g["labels"]["deployment"] == "demo" for g in nixl)


def test_preflight_checks_each_exporter_port_free() -> None:
    ports = dict(contexts(inventory(overrides=TWO_PER_HOST))["d1"].ports)
    assert ports[9201] == "decode NIXL telemetry" and ports[9211] == "decode-1 NIXL telemetry"


def test_turned_off_it_leaves_no_variable_port_or_target() -> None:
    inv = inventory(overrides={"kv_transfer.nixl_telemetry": False})
    plan = build_plan(inv)
    assert not [k for s in plan.engines for k in _env(s) if k.startswith("NIXL_TELEMETRY")]
    jobs = [j["job_name"] for j in scrape_config(plan)["scrape_configs"]]
    assert "demo-nixl" not in jobs
    assert 9201 not in dict(contexts(inv)["d1"].ports)


# --------------------------------------------------------------------------- the rules


def one_host(overrides: dict[str, object]) -> None:
    """Both tiers and the router on host a (prefill GPU 0, decode GPU 1), then ``overrides``."""
    over = {"prefill.gpus": [0], "decode.gpus": [1], **overrides}
    inventory({"a": "192.0.2.10"}, ("a",), ("a",), "a", overrides=over)


def test_a_listener_on_an_exporters_port_is_refused_at_load() -> None:
    with pytest.raises(InventoryError) as e:
        one_host({"router.metrics_port": 9201})
    assert "port 9201 on host 'a' is already used by decode NIXL telemetry" in str(e.value)


def test_one_http_clash_is_one_message_not_two() -> None:
    with pytest.raises(InventoryError) as e:
        one_host({"decode.port": 8200})
    assert [i.message for i in e.value.issues if "8200" in i.message or "9200" in i.message] == [
        "port 8200 on host 'a' is already used by prefill HTTP"
    ]


@pytest.mark.parametrize(
    "key", ["NIXL_TELEMETRY_PROMETHEUS_PORT", "NIXL_TELEMETRY_EXPORTER", "NIXL_TELEMETRY_ENABLE"]
)
def test_a_tier_cannot_set_what_pdboot_chooses(key: str) -> None:
    with pytest.raises(InventoryError) as e:
        inventory(overrides={f"decode.env.{key}": "9090"})
    assert key in str(e.value)
