"""The system OpenSSH client, for the one read-only batch `pdboot preflight` sends each host.

Why (issue 35): on a small machine most of preflight's time over the SSH floor was pdboot's
own start: the interpreter, pydantic, paramiko with fabric and invoke (~0.1 s of imports), then
paramiko's handshakes sharing the GIL with the check modules' imports. `ssh` processes
started as soon as the inventory file is read (transport/headstart.py) do their handshakes
on other cores meanwhile, and preflight never imports paramiko when every batch goes through.

Only where a host OpenSSH reaches is one paramiko reaches too (preflight predicts `up`, which
keeps paramiko): the inventory's known_hosts file alone (no global file), no ssh_config
(``use_ssh_config: false``, or the files fabric reads say nothing fabric acts on:
``config_is_quiet``), strict host keys, no host certificates (paramiko verifies none), the
identity file alone (no agent), BatchMode (never a prompt), fabric's local user when the
inventory names none. Anything else, and
every failure of an OpenSSH batch, goes through paramiko (transport/ssh.py) as before, so every
SSH error an operator reads comes from the one classifier there.

Pure: targets and argv from plain values; headstart.py starts the processes.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# SSHSettings' defaults (inventory/schema.py), for the raw inventory read before the schema is
# imported; a unit test keeps them equal. A wrong one only costs the head start (headstart.py
# compares every target with the validated inventory's before using a process).
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_USE_SSH_CONFIG = True
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"  # ssh.known_hosts unset (transport/ssh.py too)
LOCAL = "local"  # schema.LOCAL: this machine, no SSH

# Key exchanges paramiko speaks too, cheapest first. OpenSSH's default since 9.0,
# sntrup761x25519, costs ~70 ms of CPU per connection on each side (measured: 10 connects
# 0.77 s of user time against 0.08 s with curve25519), which at 8 and 32 hosts on a small
# machine cost more than the head start won. The batch carries facts, not secrets.
KEX = (
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "ecdh-sha2-nistp256",
    "ecdh-sha2-nistp384",
    "ecdh-sha2-nistp521",
    "diffie-hellman-group16-sha512",
    "diffie-hellman-group-exchange-sha256",
    "diffie-hellman-group14-sha256",
)

# Keepalives: one every 3 s, the host lost after 4 unanswered (12 s); ssh.py's watchdog
# takes its limits from these.
ALIVE_INTERVAL_S = 3
ALIVE_COUNT = 4

# The ssh_config files fabric reads (paramiko follows no Include), and fabric's own config
# files, which could set the user, port or keys of every connection.
SSH_CONFIG_FILES = ("/etc/ssh/ssh_config", "~/.ssh/config")
FABRIC_CONFIG_FILES = tuple(
    f"{prefix}.{ext}"
    for prefix in ("/etc/fabric", "~/.fabric")
    for ext in ("yaml", "yml", "json", "py")
)
# ssh_config keywords that change nothing about where or how pdboot's paramiko connects:
# fabric reads HostName, User, Port, IdentityFile, ProxyJump, ProxyCommand, ConnectTimeout and
# ForwardAgent; ssh.py UserKnownHostsFile; paramiko's lookup Match and the Canonical* options.
# A distribution's default file (Debian's: Include, Host *, SendEnv, HashKnownHosts,
# GSSAPIAuthentication) holds only these. Any other keyword: paramiko goes.
QUIET_KEYWORDS = frozenset(
    {
        "host",
        "include",
        "sendenv",
        "setenv",
        "hashknownhosts",
        "gssapiauthentication",
        "gssapidelegatecredentials",
        "forwardx11",
        "forwardx11trusted",
        "serveraliveinterval",
        "serveralivecountmax",
        "loglevel",
        "visualhostkey",
    }
)

_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:_-]*")  # a name, IPv4 or IPv6; never an option
_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*")
# OpenSSH expands %-tokens and splits on blanks in these paths; paramiko does neither.
_PATH_UNSAFE = re.compile(r"[\s%\"'\\]")


@dataclass(frozen=True)
class Target:
    """How OpenSSH reaches one host, when it can reach it the way paramiko would."""

    address: str
    user: str | None
    port: int | None
    identity_file: str
    known_hosts: str
    connect_timeout: int


def config_is_quiet(text: str) -> bool:
    """Whether an ssh_config file holds only QUIET_KEYWORDS (and comments): then fabric,
    reading it, connects exactly as with ``use_ssh_config: false``."""
    lines = (ln.strip() for ln in text.splitlines())
    keywords = {re.split(r"[\s=]", ln, maxsplit=1)[0].lower() for ln in lines if ln}
    return {k for k in keywords if not k.startswith("#")} <= QUIET_KEYWORDS


def target(
    address: str,
    *,
    user: str | None,
    port: int | None,
    identity_file: str | None,
    known_hosts: str | None,
    connect_timeout: float,
    use_ssh_config: bool,
    ssh_config_quiet: bool = False,
) -> Target | None:
    """The Target for these effective SSH settings, or None where paramiko must go: an
    ssh_config to honour (``use_ssh_config`` and not ``ssh_config_quiet``: fabric reads its own
    subset of it), no identity file (paramiko would also try the agent and the default keys),
    a value OpenSSH would read otherwise."""
    if (use_ssh_config and not ssh_config_quiet) or not identity_file or address == LOCAL:
        return None
    if not _ADDRESS.fullmatch(address):
        return None
    if user is not None and not _USER.fullmatch(user):
        return None
    ident = os.path.expanduser(identity_file)
    known = os.path.expanduser(known_hosts or DEFAULT_KNOWN_HOSTS)
    if _PATH_UNSAFE.search(ident) or _PATH_UNSAFE.search(known):
        return None
    return Target(address, user, port, ident, known, int(max(1, connect_timeout)))


def argv(t: Target, command: str, ssh: str = "ssh") -> list[str]:
    """The ssh command line running ``command`` (one shell line) on the target."""
    opts = {
        "BatchMode": "yes",
        "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": t.known_hosts,
        "GlobalKnownHostsFile": "/dev/null",
        "UpdateHostKeys": "no",
        "CheckHostIP": "no",
        # plain keys only: paramiko verifies no host certificate (known_hosts.py)
        "HostKeyAlgorithms": "-*-cert-v01@openssh.com",
        "KexAlgorithms": ",".join(KEX),
        "IdentitiesOnly": "yes",
        "IdentityAgent": "none",
        "ConnectTimeout": str(t.connect_timeout),
        "ServerAliveInterval": str(ALIVE_INTERVAL_S),
        "ServerAliveCountMax": str(ALIVE_COUNT),
        "ControlMaster": "no",
        "ControlPath": "none",
        "ForwardAgent": "no",
        "ForwardX11": "no",
        "ClearAllForwardings": "yes",
        "PermitLocalCommand": "no",
        "LogLevel": "ERROR",
    }
    out = [ssh, "-F", "/dev/null", "-T", "-i", t.identity_file]
    for k, v in opts.items():
        out += ["-o", f"{k}={v}"]
    if t.port is not None:
        out += ["-p", str(t.port)]
    # no user in the inventory: fabric's, the login name (getpass reads $LOGNAME, $USER
    # first), where OpenSSH would take the account's name
    out += ["-l", t.user if t.user is not None else getpass.getuser()]
    return [*out, "--", t.address, command]


def raw_targets(doc: Any, ssh_config_quiet: bool = False) -> dict[str, Target]:
    """Targets from an inventory as YAML gave it, before any validation: for the hosts whose
    values are plainly there (else none). Never trusted alone: headstart.py uses a process
    only when the validated inventory gives the same Target."""
    if not isinstance(doc, Mapping):
        return {}
    defaults, hosts = doc.get("ssh", {}), doc.get("hosts")
    if not isinstance(defaults, Mapping) or not isinstance(hosts, Mapping):
        return {}
    out: dict[str, Target] = {}
    for name, host in hosts.items():
        if not isinstance(name, str) or not isinstance(host, Mapping):
            continue
        over = host.get("ssh", {})
        if not isinstance(over, Mapping) or "use_ssh_config" in over:
            continue
        eff = {**defaults, **{k: v for k, v in over.items() if v is not None}}
        t = _raw_target(host.get("address"), eff, ssh_config_quiet)
        if t is not None:
            out[name] = t
    return out


def _raw_target(address: Any, s: Mapping[str, Any], ssh_config_quiet: bool) -> Target | None:
    user, port, ident = s.get("user"), s.get("port"), s.get("identity_file")
    known = s.get("known_hosts")
    timeout = s.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    use_cfg = s.get("use_ssh_config", DEFAULT_USE_SSH_CONFIG)
    plain = (
        isinstance(address, str)
        and (user is None or isinstance(user, str))
        and (port is None or (type(port) is int and 1 <= port <= 65535))
        and isinstance(ident, str)
        and (known is None or isinstance(known, str))
        and type(timeout) in (int, float)
        and type(use_cfg) is bool
    )
    if not plain:
        return None
    return target(
        address,
        user=user,
        port=port,
        identity_file=ident,
        known_hosts=known,
        connect_timeout=timeout,
        use_ssh_config=use_cfg,
        ssh_config_quiet=ssh_config_quiet,
    )


_TCP_TIMEOUT = re.compile(r"^ssh: connect to host \S+ port \d+: Connection timed out\s*$", re.M)


def connect_timed_out(stderr: str) -> bool:
    """ssh's TCP connect gave up after ConnectTimeout: paramiko would wait as long again,
    for the same answer, so the caller reports it at once."""
    return bool(_TCP_TIMEOUT.search(stderr))


SSH_FAILED = 255  # ssh's own failures (connect, host key, auth, a dropped link); a batch
# script itself ends with its last printf (0), or 1 where it cannot even make its directory
