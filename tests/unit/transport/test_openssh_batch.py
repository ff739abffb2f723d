"""preflight's batch over the system OpenSSH client (transport/openssh.py, headstart.py): the
targets read from the raw YAML before any validation must be the ones the validated inventory
gives (else the process started ahead is thrown away), only settings paramiko would honour the
same way get one, and the command line keeps OpenSSH to what paramiko would accept."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdboot.cli_preflight import plain_line
from pdboot.inventory import schema, yamlsafe
from pdboot.inventory.load import MAX_INVENTORY_BYTES, parse_inventory
from pdboot.preflight.run import openssh_target
from pdboot.transport import headstart, openssh
from pdboot.transport.connection import effective_ssh

BASE: dict[str, Any] = {
    "name": "pd",
    "model": "Qwen/Qwen3-0.6B",
    "ssh": {
        "user": "root",
        "identity_file": "/keys/id_ed25519",
        "known_hosts": "/keys/known_hosts",
        "use_ssh_config": False,
        "connect_timeout": 5,
    },
    "hosts": {"a": {"address": "10.1.0.10"}, "b": {"address": "10.1.0.11"}},
    "prefill": {"hosts": ["a"]},
    "decode": {"hosts": ["b"]},
    "router": {"host": "b"},
}


def variant(**changes: Any) -> dict[str, Any]:
    """BASE with top-level keys replaced (``ssh``/``hosts`` given whole)."""
    return {**yaml.safe_load(yaml.safe_dump(BASE)), **changes}


def target_of(inv: schema.Inventory, name: str, quiet: bool = False) -> openssh.Target | None:
    host = inv.hosts[name]
    return openssh_target(host, effective_ssh(inv.ssh, host), quiet)


CASES = {
    "plain": variant(),
    "per-host user, port and key": variant(
        hosts={
            "a": {"address": "10.1.0.10", "ssh": {"user": "ops", "port": 2222}},
            "b": {"address": "gpu-b.lan", "ssh": {"identity_file": "/keys/other"}},
        }
    ),
    "float timeout, default known_hosts": variant(
        ssh={"identity_file": "~/.ssh/id_ed25519", "use_ssh_config": False, "connect_timeout": 2.5}
    ),
    "ssh_config wanted (the default)": variant(ssh={"identity_file": "/keys/id"}),
    "no identity file": variant(ssh={"use_ssh_config": False}),
    "a local host": variant(
        hosts={
            "a": {"address": "local", "advertise_address": "10.1.0.10"},
            "b": {"address": "10.1.0.11"},
        }
    ),
}


@pytest.mark.parametrize("quiet", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_the_raw_read_gives_the_validated_targets(case: str, quiet: bool) -> None:
    text = yaml.safe_dump(CASES[case])
    inv = parse_inventory(text)
    raw = openssh.raw_targets(yamlsafe.load(text)[1], quiet)
    validated = {n: target_of(inv, n, quiet) for n in inv.hosts}
    assert {n: raw.get(n) for n in inv.hosts} == validated


def test_which_settings_get_an_openssh_batch() -> None:
    def targets(case: str) -> dict[str, openssh.Target | None]:
        inv = parse_inventory(yaml.safe_dump(CASES[case]))
        return {n: target_of(inv, n) for n in inv.hosts}

    plain = targets("plain")
    assert plain["a"] == openssh.Target(
        "10.1.0.10", "root", None, "/keys/id_ed25519", "/keys/known_hosts", 5
    )
    per_host = targets("per-host user, port and key")
    assert (per_host["a"].user, per_host["a"].port) == ("ops", 2222)  # type: ignore[union-attr]
    assert per_host["b"].identity_file == "/keys/other"  # type: ignore[union-attr]
    home = targets("float timeout, default known_hosts")["a"]
    assert home is not None and home.known_hosts == str(Path("~/.ssh/known_hosts").expanduser())
    assert home.connect_timeout == 2
    # paramiko's alone: fabric's reading of ~/.ssh/config, the agent and default keys
    for case in ("ssh_config wanted (the default)", "no identity file"):
        assert set(targets(case).values()) == {None}, case
    assert targets("a local host")["a"] is None


# Debian 12's /etc/ssh/ssh_config (openssh-client 9.2p1), comments shortened
DEBIAN_SSH_CONFIG = """\
# This is the ssh client system-wide configuration file.
Include /etc/ssh/ssh_config.d/*.conf

Host *
#   ForwardAgent no
#   Port 22
    SendEnv LANG LC_*
    HashKnownHosts yes
    GSSAPIAuthentication yes
"""


def test_an_ssh_config_fabric_would_act_on_keeps_paramiko() -> None:
    assert openssh.config_is_quiet(DEBIAN_SSH_CONFIG)
    assert openssh.config_is_quiet("") and openssh.config_is_quiet("# nothing\n\n")
    for loud in (
        "Host gpu-*\n    User ops\n",
        "HostName=10.9.9.9\n",
        "Host *\n  IdentityFile ~/.ssh/other\n",
        "Match host 10.1.0.10\n",
        "Host bastion\n  ProxyJump jump\n",
        "PORT 2222\n",  # keywords are case-blind
        "Host *\n  UserKnownHostsFile /etc/ssh/hosts\n",
        "Host *\n  ForwardAgent yes\n",  # not read to reach a host, but not listed either
    ):
        assert not openssh.config_is_quiet(loud), loud
    # with a quiet one, the default (use_ssh_config: true) gets the same Target as false
    inv = parse_inventory(yaml.safe_dump(CASES["ssh_config wanted (the default)"]))
    assert target_of(inv, "a") is None
    quiet = target_of(inv, "a", quiet=True)
    assert quiet is not None and quiet.identity_file == "/keys/id"


def test_fabric_config_files_or_a_loud_ssh_config_stop_the_head_start(tmp_path: Path) -> None:
    ssh_cfg, fabric_cfg = tmp_path / "ssh_config", tmp_path / "fabric.yaml"
    configs = {"ssh_configs": [str(ssh_cfg)], "fabric_configs": [str(fabric_cfg)]}
    assert headstart.client_configs(**configs) is True  # neither exists
    ssh_cfg.write_text(DEBIAN_SSH_CONFIG)
    assert headstart.client_configs(**configs) is True
    ssh_cfg.write_text(DEBIAN_SSH_CONFIG + "Host *\n    User deploy\n")
    assert headstart.client_configs(**configs) is False
    fabric_cfg.write_text("user: deploy\n")  # may set any connection's user: no batch at all
    assert headstart.client_configs(**configs) is None


def test_values_openssh_would_read_otherwise_get_no_target() -> None:
    def t(address: str = "10.0.0.1", user: str | None = "root", ident: str = "/k/id") -> Any:
        return openssh.target(
            address,
            user=user,
            port=None,
            identity_file=ident,
            known_hosts="/k/kh",
            connect_timeout=5,
            use_ssh_config=False,
        )

    assert t() is not None and t(address="fe80::1") is not None
    assert t(address="-oProxyCommand=x") is None  # never an option
    assert t(address="a b") is None
    assert t(user="-l") is None and t(user="x y") is None
    # OpenSSH expands %-tokens and splits on blanks (the schema refuses both today)
    assert t(ident="/k/my key") is None and t(ident="/k/id_%h") is None


def test_the_command_line_keeps_openssh_to_what_paramiko_accepts() -> None:
    target = openssh.Target("10.0.0.1", "ops", 2222, "/k/id", "/k/kh", 5)
    line = openssh.argv(target, "bash -s", ssh="/usr/bin/ssh")
    opts = dict(line[i + 1].split("=", 1) for i, a in enumerate(line) if a == "-o")
    assert line[:4] == ["/usr/bin/ssh", "-F", "/dev/null", "-T"]  # no ~/.ssh/config
    assert line[-3:] == ["--", "10.0.0.1", "bash -s"]  # the address is never an option
    assert opts["StrictHostKeyChecking"] == "yes" and opts["BatchMode"] == "yes"
    assert opts["UserKnownHostsFile"] == "/k/kh" and opts["GlobalKnownHostsFile"] == "/dev/null"
    assert opts["UpdateHostKeys"] == "no"  # the operator's file is never written
    assert opts["HostKeyAlgorithms"] == "-*-cert-v01@openssh.com"  # paramiko: no certificates
    assert (opts["IdentitiesOnly"], opts["IdentityAgent"]) == ("yes", "none")
    assert line[line.index("-i") + 1] == "/k/id"
    assert line[line.index("-p") + 1] == "2222" and line[line.index("-l") + 1] == "ops"
    assert opts["ConnectTimeout"] == "5"
    assert opts["KexAlgorithms"].split(",")[0] == "curve25519-sha256"  # not sntrup761: CPU
    assert (opts["ControlMaster"], opts["ForwardAgent"]) == ("no", "no")
    # no user in the inventory: fabric's (the login name), not OpenSSH's account name
    nobody_named = openssh.Target("10.0.0.1", None, None, "/k/id", "/k/kh", 5)
    anyone = openssh.argv(nobody_named, "bash -s")
    assert anyone[anyone.index("-l") + 1] == getpass.getuser()


def test_the_raw_reads_defaults_are_the_schemas() -> None:
    s = schema.SSHSettings()
    assert s.connect_timeout == openssh.DEFAULT_CONNECT_TIMEOUT
    assert s.use_ssh_config == openssh.DEFAULT_USE_SSH_CONFIG
    assert openssh.LOCAL == schema.LOCAL
    assert headstart._MAX_BYTES == MAX_INVENTORY_BYTES


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    p = tmp_path / "inv.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_the_head_start_connects_only_to_the_deployments_own_hosts(tmp_path: Path) -> None:
    doc = variant(
        hosts={
            "a": {"address": "10.1.0.10"},
            "b": {"address": "10.1.0.11"},
            "spare": {"address": "10.1.0.12"},
        }
    )
    assert set(headstart._targets(write(tmp_path, doc))) == {"a", "b"}
    # an example's documentation address: nothing is started (preflight refuses it)
    doc["hosts"]["b"] = {"address": "192.0.2.11"}
    assert headstart._targets(write(tmp_path, doc)) == {}
    del doc["router"]  # not plain: the validation says what is wrong, nothing starts
    assert headstart._targets(write(tmp_path, doc)) == {}


@pytest.mark.parametrize(
    "args",
    [
        ["--only", "gpu", "inv.yaml"],  # a selection is checked before anything connects
        ["inv.yaml", "--accept-new-host-keys"],  # paramiko writes the new keys
        ["a.yaml", "b.yaml"],
        ["inv.yaml", "-vv"],
        ["-h"],
        [],
    ],
)
def test_other_command_lines_get_no_head_start(args: list[str]) -> None:
    # entry.py starts the processes (and skips typer) only for a plain line
    assert plain_line(args) is None


def test_the_head_start_is_off_with_the_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, variant())
    monkeypatch.setattr(headstart, "_current", None)
    monkeypatch.setenv(headstart.SWITCH, "paramiko")
    headstart.begin(path)
    assert headstart.current() is None


# ssh 9.2p1's stderr, captured against testbed hosts: an address nobody answers on, a host
# whose key is not known, a closed port
TIMED_OUT = "ssh: connect to host 10.77.1.250 port 22: Connection timed out\r\n"
UNKNOWN_KEY = (
    "No ED25519 host key is known for 10.77.1.10 and you have requested strict checking.\r\n"
    "Host key verification failed.\r\n"
)
REFUSED = "ssh: connect to host 10.77.1.10 port 2: Connection refused\r\n"


def test_only_a_tcp_timeout_is_reported_without_asking_paramiko() -> None:
    # paramiko would wait the same connect timeout again; every other failure is its to tell
    assert openssh.connect_timed_out(TIMED_OUT)
    assert not openssh.connect_timed_out(UNKNOWN_KEY)
    assert not openssh.connect_timed_out(REFUSED)
    assert not openssh.connect_timed_out("ssh: connect to host h port 22: Connection timed out x")


def test_the_key_exchanges_are_ones_paramiko_speaks() -> None:
    import paramiko

    # the same algorithm under its RFC 8731 name and libssh's
    speaks = {k.replace("@libssh.org", "") for k in paramiko.Transport._preferred_kex}
    assert {k.replace("@libssh.org", "") for k in openssh.KEX} <= speaks
