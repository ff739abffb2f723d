"""Hostile and broken inventories (issue 12): the review's exact cases. Each one ends in
InventoryError with ``file:line: key: message``, never a traceback, a hang or a pass."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from pdboot.inventory.load import (
    MAX_INVENTORY_BYTES,
    InventoryError,
    InventoryIssue,
    load_inventory,
    parse_inventory,
)
from pdboot.inventory.safety import (
    check_address,
    check_reference,
    is_loopback_or_unspecified,
    looks_like_token,
)
from tests.shared_data import SERVE_ARGS_JSON
from tests.unit.builders import TWO_HOSTS_TEXT

LOCATED = re.compile(r"^inv\.yaml:\d+: ")

GOOD = TWO_HOSTS_TEXT


def issues(text: str) -> list[InventoryIssue]:
    with pytest.raises(InventoryError) as exc:
        parse_inventory(text, file="inv.yaml")
    found = exc.value.issues
    for i in found:  # every error located
        assert i.line is not None and LOCATED.match(str(i)), str(i)
    return found


def refused(text: str, key: str, words: str) -> InventoryIssue:
    found = issues(text)
    match = [i for i in found if str(i).split(": ", 2)[1] == key]
    assert match, [str(i) for i in found]
    assert re.search(words, match[0].message, re.IGNORECASE), str(match[0])
    return match[0]


def with_(extra: str) -> str:
    """GOOD plus more top-level YAML (later keys are appended, never duplicated)."""
    return GOOD + extra


def test_the_base_is_valid() -> None:
    assert parse_inventory(GOOD).hosts["gpu-a"].address == "192.0.2.10"


# --------------------------------------------------------------------------- 1. addresses


@pytest.mark.parametrize(
    "address",
    [
        "i-0abc;touch${IFS}PWNED;#",  # the review's ProxyCommand %h injection
        "host name",
        "$(id)",
        "`id`",
        "a|b",
        "-oProxyCommand=x",
        "%h",
        "h\\x",
        "[host]",
        "-leading.example",
        "a..b",
        "x" * 64 + ".example",
        "192.0.2.300",
    ],
)
def test_addresses_that_are_not_ip_or_host_name_are_refused(address: str) -> None:
    text = GOOD.replace("address: 192.0.2.10", f"address: {json.dumps(address)}")
    refused(text, "hosts.gpu-a.address", "not|neither|IPv4|IPv6|numeric")


def test_the_injection_address_is_refused_with_its_line() -> None:
    text = GOOD.replace("address: 192.0.2.10", "address: 'i-0abc;touch${IFS}PWNED;#'")
    issue = refused(text, "hosts.gpu-a.address", "neither an IP address nor a host name")
    assert issue.line == 4


@pytest.mark.parametrize(
    ("given", "normalised"),
    [
        ("gpu-1.Example.COM.", "gpu-1.example.com"),
        ("10.0.0.5", "10.0.0.5"),
        ("2001:DB8::0:1", "2001:db8::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("local", "local"),
        ("i-0abc", "i-0abc"),
    ],
)
def test_good_addresses_are_normalised(given: str, normalised: str) -> None:
    assert check_address(given) == normalised


@pytest.mark.parametrize("spelling", ["127.1", "0", "2130706433", "0x7f000001", "0177.0.0.1"])
def test_non_canonical_numeric_ipv4_is_refused(spelling: str) -> None:
    with pytest.raises(ValueError, match="non-canonical"):
        check_address(spelling)


@pytest.mark.parametrize(
    "spelling",
    [
        "127.1", "0", "2130706433", "0x7f000001", "::ffff:127.0.0.1", "[::1]", "localhost.",
        "LOCALHOST", "localhost", "127.0.0.1", "127.255.0.9", "0.0.0.0", "::", "[::]",
        "0:0:0:0:0:0:0:1", "::ffff:0.0.0.0", "ip6-localhost", "foo.localhost", "0x0",
    ],
)  # fmt: skip
def test_every_loopback_spelling_is_recognised(spelling: str) -> None:
    assert is_loopback_or_unspecified(spelling)


@pytest.mark.parametrize("spelling", ["10.0.0.1", "gpu-a", "::ffff:10.0.0.1", "2001:db8::1"])
def test_routable_addresses_are_not_loopback(spelling: str) -> None:
    assert not is_loopback_or_unspecified(spelling)


@pytest.mark.parametrize(
    "spelling", ["::ffff:127.0.0.1", "[::1]", "localhost.", "LOCALHOST", "0.0.0.0", "127.0.0.2"]
)
def test_loopback_spellings_fail_the_multi_host_rule(spelling: str) -> None:
    text = GOOD.replace("address: 192.0.2.11", f"address: '{spelling}'")
    refused(text, "hosts.gpu-b.address", "multi-host")


def test_loopback_advertise_address_of_a_local_host_is_refused() -> None:
    text = GOOD.replace("{address: 192.0.2.10}", "{address: local, advertise_address: '[::1]'}")
    refused(text, "hosts.gpu-a.advertise_address", "routable")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("user", "root;id"),
        ("user", "%r"),
        ("identity_file", "~/.ssh/id_${IFS}x"),
        ("identity_file", "/tmp/a b"),
        ("known_hosts", "/tmp/%h"),
        ("known_hosts", "`id`"),
    ],
)
def test_ssh_values_that_ssh_config_or_a_shell_would_expand_are_refused(
    key: str, value: str
) -> None:
    refused(with_(f"ssh: {{{key}: {json.dumps(value)}}}\n"), f"ssh.{key}", "valid|may only")


def test_host_level_ssh_overrides_are_checked_too() -> None:
    text = GOOD.replace("{address: 192.0.2.10}", "{address: 192.0.2.10, ssh: {user: 'a b'}}")
    refused(text, "hosts.gpu-a.ssh.user", "not a valid user")


# --------------------------------------------------------------------------- 3. paths


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("/etc", "system directory"),
        ("/", "system directory"),
        ("/usr/local", "system directory"),
        ("/var", "system directory"),
        ("/root", "system directory"),
        ("/var/lib", "system directory"),
        ("relative/dir", "absolute"),
        ("", "absolute"),
        ("/var/lib/../../etc", "normalised"),
        ("/var//lib/pdboot", "normalised"),
        ("/opt/./pdboot", "normalised"),
        ("/opt/pd boot", "may only"),
        ("/opt/$HOME", "may only"),
    ],
)
def test_remote_dir_must_be_absolute_normalised_and_not_a_system_dir(value: str, why: str) -> None:
    refused(with_(f"remote_dir: {json.dumps(value)}\n"), "remote_dir", why)


@pytest.mark.parametrize("value", ["/var/lib/pdboot", "/opt/pdboot", "/srv/pd/", "/home/me/pd"])
def test_remote_dir_below_a_system_dir_is_fine(value: str) -> None:
    assert parse_inventory(with_(f"remote_dir: {value}\n")).remote_dir == value.rstrip("/")


def test_remote_dir_etc_with_name_ssh_is_refused() -> None:
    text = with_("remote_dir: /etc\n").replace("name: demo", "name: ssh")
    refused(text, "remote_dir", "system directory")


@pytest.mark.parametrize("name", ["../x", "a/b", "Demo", "", "-x", "x" * 64])
def test_name_is_a_safe_identifier(name: str) -> None:
    refused(GOOD.replace("name: demo", f"name: {json.dumps(name)}"), "name", "lower-case letters")


@pytest.mark.parametrize("model", ["/", "/etc", "/proc/1", "/usr/share/x", "/var"])
def test_model_path_must_not_bind_mount_a_system_dir(model: str) -> None:
    text = GOOD.replace("model: meta-llama/Llama-3.1-8B-Instruct", f"model: {model}")
    refused(text, "model", "system directory")


@pytest.mark.parametrize("model", ["", " ", "a b", "org/name/extra", "$(id)"])
def test_model_must_be_an_hf_id_or_a_path(model: str) -> None:
    text = GOOD.replace("model: meta-llama/Llama-3.1-8B-Instruct", f"model: {json.dumps(model)}")
    refused(text, "model", "Hugging Face id|at least 1")


def test_model_paths_outside_system_dirs_are_fine() -> None:
    text = GOOD.replace("model: meta-llama/Llama-3.1-8B-Instruct", "model: /models/llama-8b")
    assert parse_inventory(text).model == "/models/llama-8b"


@pytest.mark.parametrize("value", ["", "relative", "/", "/etc"])
def test_hf_cache_is_an_absolute_non_system_path(value: str) -> None:
    text = with_(f"container: {{hf_cache: {json.dumps(value)}}}\n")
    refused(text, "container.hf_cache", "absolute|system")


# --------------------------------------------------------------------------- 4. broken YAML


def test_recursive_alias_is_refused() -> None:
    refused_yaml(with_("x: &a [*a]\n"), "recursive alias")


def test_500_nested_brackets_are_refused() -> None:
    refused_yaml(with_("x: " + "[" * 500 + "]" * 500 + "\n"), "nested deeper")


def test_alias_bomb_is_refused_fast() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    t0 = time.monotonic()
    refused_yaml("\n".join(lines) + "\n" + GOOD, "expands to more than")
    # a hang detector, not a speed target: expanded, the bomb's 10^9 nodes take minutes
    assert time.monotonic() - t0 < 10


def test_alias_bomb_inside_kv_connector_extra_config_is_refused() -> None:
    bomb = "kv_transfer:\n  kv_connector_extra_config:\n"
    bomb += "    a0: &a0 [xxxxxxxxxxxxxxxx, xxxxxxxxxxxxxxxx, xxxxxxxxxxxxxxxx, xxxxxxxxxxxxxxxx]\n"
    for i in range(1, 12):
        bomb += f"    a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
    refused_yaml(with_(bomb), "expands to more than")


def test_plain_aliases_and_merge_keys_still_work() -> None:
    text = GOOD.replace(
        "  gpu-a: {address: 192.0.2.10}",
        "  gpu-a: {address: 192.0.2.10, <<: &h {rdma_devices: [mlx5_0]}}\n"
        "  gpu-c: {<<: *h, address: 192.0.2.12}",
    )
    assert parse_inventory(text).hosts["gpu-c"].rdma_devices == ["mlx5_0"]


def refused_yaml(text: str, words: str) -> None:
    found = issues(text)
    assert len(found) == 1 and words in found[0].message, [str(i) for i in found]


def test_integer_of_4301_digits_is_refused() -> None:
    refused_yaml(with_("timeouts: {ready_seconds: " + "9" * 4301 + "}\n"), "more than 40 digits")


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e999", "-1.0e999", "1.5e999"])
@pytest.mark.parametrize(
    "key",
    [
        "timeouts.ready_seconds",
        "timeouts.poll_interval_seconds",
        "ssh.connect_timeout",
        "ssh.command_timeout",
        "requirements.link_gbps",
        "requirements.min_free_disk_gb",
    ],
)
def test_infinite_and_nan_numbers_are_refused(key: str, value: str) -> None:
    section, field = key.split(".")
    refused(with_(f"{section}: {{{field}: {value}}}\n"), key, "finite|valid number")


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("2024-01-01", "date"),
        ("2024-01-01T10:00:00Z", "date"),
        ("!!set {a, b}", "set"),
        ("!!binary aGVsbG8=", "binary"),
        ("{1: x}", "keys must be text"),
        ('"a\\0b"', "NUL"),
        ('"a\\x07b"', "control character"),
    ],
)
def test_values_json_and_compose_cannot_carry_are_refused_with_their_key(
    value: str, what: str
) -> None:
    text = with_(f"kv_transfer:\n  kv_connector_extra_config:\n    k: {value}\n")
    found = issues(text)
    assert any(what in i.message and i.line == 11 for i in found), [str(i) for i in found]


@pytest.mark.parametrize("value", ["2024-01-01", '"x\\0"', "!!binary aGVsbG8="])
def test_bad_values_inside_env_are_refused(value: str) -> None:
    found = issues(
        GOOD.replace(
            "prefill: {hosts: [gpu-a]}", f"prefill: {{hosts: [gpu-a], env: {{A: {value}}}}}"
        )
    )
    assert found[0].line == 6 and "prefill.env.A" in str(found[0])


def test_nul_in_the_raw_text_is_a_located_yaml_error() -> None:
    found = issues(GOOD + "x: a\0b\n")
    assert found[0].line == 9 and "not valid YAML" in found[0].message


def test_oversized_text_is_refused() -> None:
    found = issues("#" * (MAX_INVENTORY_BYTES + 1))
    assert "larger than 1 MiB" in found[0].message


def test_reading_dev_zero_is_bounded() -> None:
    with pytest.raises(InventoryError, match="character device, not a regular file"):
        load_inventory("/dev/zero")


def test_non_utf8_file_has_a_line(tmp_path: Path) -> None:
    p = tmp_path / "inv.yaml"
    p.write_bytes(b"name: demo\nmodel: \xff\n")
    with pytest.raises(InventoryError) as exc:
        load_inventory(p)
    assert exc.value.issues[0].line == 2


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ('image: ""', "image", "not a valid image"),
        ('router_image: "a b"', "router_image", "not a valid image"),
        ('container: {hf_cache: ""}', "container.hf_cache", "absolute"),
        ('served_model_name: " "', "served_model_name", "non-empty"),
        ("container: {ulimits: {nofile: 18446744073709551616}}", "container.ulimits.nofile", ""),
        ("container: {ulimits: {memlock: -2}}", "container.ulimits.memlock", "greater than"),
        ("container: {ulimits: {nofile: 2000000000}}", "container.ulimits.nofile", "less than"),
        ("container: {shm_size: 99999999999999g}", "container.shm_size", "size"),
        ("timeouts: {ready_seconds: 1e10}", "timeouts.ready_seconds", "less than or equal"),
        ("timeouts: {ready_seconds: 0}", "timeouts.ready_seconds", "greater than"),
        ("timeouts: {poll_interval_seconds: 0.0001}", "timeouts.poll_interval_seconds", ""),
        ("requirements: {min_driver: abc}", "requirements.min_driver", "version such as"),
        ("requirements: {cuda: 'x'}", "requirements.cuda", "version such as"),
        ("requirements: {compute_capability: '12'}", "requirements.compute_capability", ""),
        ("requirements: {gpu_name: ''}", "requirements.gpu_name", "empty"),
        ("router: {host: gpu-a, port: yes}", "router.port", "integer"),
        ("router: {host: gpu-a, request_timeout_secs: 99999999999}", "router.request_timeout_secs",
         ""),
        ("ssh: {port: true}", "ssh.port", "integer"),
        ("ssh: {connect_timeout: 1e6}", "ssh.connect_timeout", "less than"),
        ("kv_transfer: {kv_port: '5600'}", "kv_transfer.kv_port", "integer"),
        ("kv_transfer: {kv_connector_module_path: 'os; rm'}",
         "kv_transfer.kv_connector_module_path", ""),
        ("kv_transfer: {ucx: {tls: 'rc cuda'}}", "kv_transfer.ucx.tls", "UCX transports"),
        ("kv_transfer: {ucx: {env: {'UCX_A B': x}}}", "kv_transfer.ucx.env", "variable name"),
    ],
)  # fmt: skip
def test_values_compose_or_vllm_would_refuse(extra: str, key: str, words: str) -> None:
    text = GOOD.replace("router: {host: gpu-a}\n", "") if extra.startswith("router:") else GOOD
    refused(text + extra + "\n", key, words)


@pytest.mark.parametrize("tp", [2**31, 0, 65, True])
def test_tensor_parallel_size_is_bounded(tp: object) -> None:
    text = GOOD.replace(
        "prefill: {hosts: [gpu-a]}",
        f"prefill: {{hosts: [gpu-a], tensor_parallel_size: {json.dumps(tp)}}}",
    )
    refused(text, "prefill.tensor_parallel_size", "")


@pytest.mark.parametrize(
    ("k", "why"), [("''", "variable name"), ("'A B'", "variable name"), ("1A", "variable name")]
)
def test_env_keys_must_be_variable_names(k: str, why: str) -> None:
    text = GOOD.replace(
        "prefill: {hosts: [gpu-a]}", f"prefill: {{hosts: [gpu-a], env: {{{k}: x}}}}"
    )
    refused(text, "prefill.env", why)


def test_gpu_index_bounded() -> None:
    text = GOOD.replace(
        "prefill: {hosts: [gpu-a]}", "prefill: {hosts: [gpu-a], gpus: [4294967296]}"
    )
    refused(text, "prefill.gpus", "0..63")


def test_net_interface_and_rdma_devices_are_names() -> None:
    text = GOOD.replace(
        "{address: 192.0.2.10}",
        "{address: 192.0.2.10, net_interface: 'eth0;id', rdma_devices: ['mlx5 0']}",
    )
    found = {str(i).split(": ", 2)[1] for i in issues(text)}
    assert found == {"hosts.gpu-a.net_interface", "hosts.gpu-a.rdma_devices"}


# --------------------------------------------------------------------------- 6. secrets


@pytest.mark.parametrize(
    "ref",
    [
        "env:hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",  # the review's case
        "env:sk-proj-abcdefghijklmnop",
        "env:ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "env:Ab3dE6gH9jK2mN5pQ8sT1vW4",  # long random-looking run
        "file:hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
        "env:A B",
        "file:/tmp/a b",
    ],
)
@pytest.mark.parametrize("field", ["hf_token", "api_key"])
def test_token_values_after_env_or_file_are_refused(field: str, ref: str) -> None:
    refused(with_(f"secrets: {{{field}: {json.dumps(ref)}}}\n"), f"secrets.{field}", "")


@pytest.mark.parametrize(
    "ref",
    [
        "env:HF_TOKEN",
        "env:PDBOOT_API_KEY_2024",
        "file:/etc/pdboot/api-key",
        "file:~/.config/pd/key",
    ],
)
def test_references_are_accepted(ref: str) -> None:
    inv = parse_inventory(
        with_(
            f"secrets: {{api_key: {json.dumps(ref)}, env: {{WANDB_API_KEY: {json.dumps(ref)}}}}}\n"
        )
    )
    assert inv.secrets.api_key == ref and inv.secrets.env == {"WANDB_API_KEY": ref}


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ("{VLLM_API_KEY: env:K}", "secrets.api_key"),
        ("{HF_TOKEN: env:K}", "secrets.hf_token"),
        ("{X: sk-abcdefghijklmnopqrstuv}", "reference"),
        ("{'A-B': env:K}", "variable name"),
    ],
)
def test_secrets_env_map_rules(env: str, words: str) -> None:
    refused(with_(f"secrets: {{env: {env}}}\n"), "secrets.env", words)


@pytest.mark.parametrize(
    "args",
    [
        '["--api-key", "x"]',
        '["--api_key=x"]',
        '["--hf-token", "x"]',
        '["--max-model-len", "1024", "--hf-token=x"]',
    ],
)
def test_secret_flags_in_extra_args_point_to_secrets(args: str) -> None:
    text = GOOD.replace(
        "decode: {hosts: [gpu-b]}", f"decode: {{hosts: [gpu-b], extra_args: {args}}}"
    )
    found = issues(text)
    assert any("secrets." in i.message and "command line" in i.message for i in found)


def test_secret_flag_in_router_extra_args_is_refused() -> None:
    text = GOOD.replace(
        "router: {host: gpu-a}", 'router: {host: gpu-a, extra_args: ["--api-key", "x"]}'
    )
    refused(text, "router.extra_args[0]", "secrets.api_key")


def test_secret_flags_are_real_vllm_options() -> None:
    from pdboot.inventory.rules import SECRET_FLAGS

    actions = json.loads(SERVE_ARGS_JSON.read_text())["actions"]
    options = {o for a in actions for o in a["option_strings"]}
    assert set(SECRET_FLAGS) <= options


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ("{VLLM_API_KEY: x}", "secrets.api_key"),
        ("{HF_TOKEN: x}", "secrets.hf_token"),
        ("{WANDB_API_KEY: x}", "looks like a secret"),
        ("{MY_SECRET: x}", "looks like a secret"),
        ("{DB_PASSWORD: x}", "looks like a secret"),
        ("{NOTE: hf_abcdefghijklmnopqrstuvwxyz}", "looks like a secret"),
    ],
)
def test_secret_looking_env_is_refused(env: str, words: str) -> None:
    text = GOOD.replace("prefill: {hosts: [gpu-a]}", f"prefill: {{hosts: [gpu-a], env: {env}}}")
    found = issues(text)
    assert any(words in i.message and i.line == 6 for i in found), [str(i) for i in found]


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "VLLM_LOGGING_LEVEL", "KEYBOARD"])
def test_ordinary_env_names_pass(name: str) -> None:
    text = GOOD.replace(
        "prefill: {hosts: [gpu-a]}", f"prefill: {{hosts: [gpu-a], env: {{{name}: x}}}}"
    )
    assert name in parse_inventory(text).prefill.env


def test_token_shapes() -> None:
    assert looks_like_token("hf_" + "a" * 30) and looks_like_token("sk-" + "b" * 20)
    assert not looks_like_token("HF_TOKEN") and not looks_like_token("hf_cache_dir")


@pytest.mark.parametrize(
    "name", ["HF_TOKEN_STAGING", "HF_TOKEN_PRODUCTION_EU", "SK_LIVE_KEY_OF_TEAM_A"]
)
def test_a_variable_name_that_starts_like_a_token_is_a_name(name: str) -> None:
    # issue 33: `env:HF_TOKEN_STAGING` was refused as "looks like the secret itself"
    assert check_reference(f"env:{name}") == f"env:{name}"


@pytest.mark.parametrize("name", ["hf_AbCdEfGhIjKlMnOpQrStUv", "hf_abcdefghijklmnopqrstuv"])
def test_a_token_pasted_as_a_variable_name_is_still_refused(name: str) -> None:
    with pytest.raises(ValueError, match="looks like the secret itself"):
        check_reference(f"env:{name}")


def test_unknown_key_with_a_bracket_is_located() -> None:
    """Found by the property test: pydantic's union tags were dropped by a `[` filter."""
    found = issues(GOOD.replace("name: demo", "name: demo\n'0[': demo"))
    assert found[0].line == 2 and "unknown key '0['" in found[0].message
