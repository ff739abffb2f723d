"""Checks on single inventory values that could reach a shell, ssh_config or the host's system.

Pure functions: each returns the normalised value or raises ValueError with the reason
(the inventory's pydantic validators turn that into ``file:line: key: message``).
"""

from __future__ import annotations

import ipaddress
import itertools
import posixpath
import re
import socket

from pdboot.inventory.hostpaths import sensitive_reason

LOCAL = "local"

# RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens.
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")

# Characters a path may hold: nothing a shell, ssh_config (%, ~ after the start) or
# compose interpolation ($) gives a meaning to.
_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+@:,=-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Directories whose removal or bind-mount would hurt the host. Exactly these are refused
# as remote_dir / hf_cache / a model path; the ones in _SYSTEM_TREES refuse their whole tree.
_SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/sbin",
    "/sys",
    "/usr",
)
_SYSTEM_DIRS = frozenset(
    (
        "/",
        "/home",
        "/media",
        "/mnt",
        "/opt",
        "/root",
        "/run",
        "/srv",
        "/snap",
        "/tmp",  # noqa: S108
        "/var",
        "/var/lib",
        "/var/log",
        "/var/run",
        "/var/tmp",  # noqa: S108
        "/var/cache",
        "/var/spool",
        "/var/lib/docker",
        "/var/mail",
        "/var/opt",
        "/var/local",
        "/var/backups",
        "/lost+found",
    )
)


def check_address(value: str) -> str:
    """An IP literal (normalised), an RFC 1123 host name (lowercase, no trailing dot) or
    `local`. Nothing else may reach SSH: ssh_config expands %h into ProxyCommand and
    Match exec lines, where `;` or `${IFS}` in an address runs on the operator's machine."""
    v = value.strip()
    if v == LOCAL:
        return v
    if not v:
        raise ValueError("must not be empty")
    if not v.isascii():
        # lower() and IDNA/NFKC would rewrite it (the Kelvin sign K in "\u212aeys.example"
        # becomes "keys.example"): which host is meant must be what the file says
        raise ValueError(
            f"{v!r} holds non-ASCII characters; write the host name in ASCII "
            "(its punycode xn--... form for an internationalised name) or an IP address"
        )
    ip = _ip_literal(v)
    if ip is not None:
        return ip
    if _inet_aton(v) is not None:
        # glibc (and so ssh, docker, NIXL) reads 127.1, 0x7f000001 or 2130706433 as an IPv4
        # address; Python's ipaddress does not. One canonical spelling keeps the multi-host
        # loopback rule and every tool agreeing on which host this is.
        raise ValueError(
            f"{v!r} is a non-canonical spelling of IPv4 address {_inet_aton(v)}; "
            "write it as four decimal numbers a.b.c.d"
        )
    name = v[:-1] if v.endswith(".") else v
    labels = name.lower().split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(
            f"{v!r} is neither an IP address nor a host name (RFC 1123: letters, digits, "
            "inner hyphens, dots), nor `local`"
        )
    if labels[-1].isdigit():
        raise ValueError(f"{v!r}: a host name cannot end in an all-numeric label")
    return ".".join(labels)


def _ip_literal(v: str) -> str | None:
    inner = v[1:-1] if v.startswith("[") and v.endswith("]") else v
    if "%" in inner:
        # vllm-router refuses a URL with a zone id, NIXL cannot advertise one, and ssh_config
        # expands `%x` in it again as a token
        raise ValueError(
            f"{v!r}: an IPv6 zone id (%...) cannot be used: the router and NIXL take no "
            "zone; give the host a global or unique-local address (or its name)"
        )
    zone = ""
    try:
        ip = ipaddress.ip_address(inner)
    except ValueError:
        if inner is not v:  # brackets promise an IPv6 literal
            raise ValueError(f"{v!r} is not an IPv6 address") from None
        return None
    if zone and not (isinstance(ip, ipaddress.IPv6Address) and ip.is_link_local):
        raise ValueError(f"{v!r}: a zone id only goes with a link-local IPv6 address")
    return f"{ip.compressed}%{zone}" if zone else ip.compressed


def _inet_aton(v: str) -> str | None:
    if not re.fullmatch(r"[0-9A-Fa-fxX.]+", v):
        return None
    try:
        return socket.inet_ntoa(socket.inet_aton(v))
    except OSError:
        return None


def is_loopback_or_unspecified(address: str) -> bool:
    """Every spelling of this-machine: names, 127/8, ::1, 0.0.0.0, ::, v4-mapped forms,
    glibc's numeric shorthands, brackets, a trailing dot, any case."""
    v = address.strip().lower()
    if v.startswith("[") and v.endswith("]"):
        v = v[1:-1]
    v = v.split("%", 1)[0].rstrip(".")
    if v in _LOOPBACK_NAMES or v.endswith(".localhost"):
        return True
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(v)
    except ValueError:
        aton = _inet_aton(v)
        if aton is None:
            return False
        ip = ipaddress.ip_address(aton)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def check_safe_token(value: str, what: str, pattern: str) -> str:
    """A short identifier-like value (user, interface, device, image) against a pattern."""
    if not re.fullmatch(pattern, value):
        raise ValueError(f"{value!r} is not a valid {what}")
    return value


def check_env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return name


def check_safe_path(value: str, what: str = "path") -> str:
    """A local path (identity file, known_hosts): no characters ssh_config or a shell
    would expand (%, $, `, spaces, quotes); ~ only as the first character."""
    if not value:
        raise ValueError(f"{what} must not be empty")
    if not _SAFE_PATH.fullmatch(value.removeprefix("~")):
        raise ValueError(
            f"{value!r}: a {what} may only hold letters, digits and _ . / + @ : , = - "
            "(~ at the start)"
        )
    return value


def check_size(value: str, what: str, max_bytes: int) -> str:
    """A Docker size (16g, 512m, 1.5g): ASCII digits, a unit, at most ``max_bytes``."""
    v = value.strip().lower()
    m = re.fullmatch(r"([0-9]{1,9})(\.[0-9]{1,3})?([bkmgt]?)", v, re.ASCII)
    if not m:
        raise ValueError(f"{value!r} is not a size like 16g or 512m (ASCII digits and a unit)")
    unit = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(3)]
    size = float(m.group(1) + (m.group(2) or "")) * unit
    if size > max_bytes:
        raise ValueError(f"{value!r} is larger than {max_bytes >> 30}g; {what} is host memory")
    return v


def check_served_name(v: str) -> str:
    """The name clients use: no spaces, printable, and not a flag (it follows
    --served-model-name on the engine's command line: `-rf` would be read as a flag)."""
    if not v.strip() or any(c.isspace() for c in v):
        raise ValueError("must be a non-empty name without spaces")
    if v.startswith("-"):
        raise ValueError(f"{v!r} starts with '-': vLLM would read it as a flag; rename it")
    if not v.isprintable():
        raise ValueError("must hold printable characters only")
    return v


def check_extra_args(args: list[str]) -> list[str]:
    """Items of a command line: non-empty (vllm-router refuses an empty argument at start,
    argparse reads it as a positional), printable, no NUL (execve would cut it)."""
    for i, a in enumerate(args):
        if not a:
            raise ValueError(f"item {i} is empty: remove it (the program would refuse to start)")
        if "\0" in a:
            raise ValueError(f"item {i} holds a NUL character")
        if any(ord(c) < 32 and c not in "\t\n" for c in a) or "\x7f" in a:
            raise ValueError(f"item {i} holds a control character: {a[:40]!r}")
    return args


# World-writable temporary trees: anyone on the host could plant weights or a project file
# there first (or a link in its place). Refused for what pdboot writes and later trusts.
TEMP_TREES = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108


def check_not_temp(value: str, what: str) -> str:
    if any(value == t or value.startswith(t + "/") for t in TEMP_TREES):
        raise ValueError(
            f"{value!r}: {what} must not be under a world-writable temporary directory "
            f"({', '.join(TEMP_TREES)}); use a directory of its own, e.g. /var/lib/pdboot"
        )
    return value


def check_abs_path(value: str, what: str, *, allow_system: bool = False) -> str:
    """An absolute, normalised host path (no `..`, `.` or `//`; trailing / dropped) that
    is not / nor a system directory."""
    if not value.startswith("/"):
        raise ValueError(f"{what} must be an absolute path, not {value!r}")
    check_safe_path(value, what)
    v = value.rstrip("/") or "/"
    if v != posixpath.normpath(v) or "//" in v:
        raise ValueError(f"{value!r}: {what} must be normalised (no `..`, `.` or `//`)")
    if allow_system:
        return v
    if v in _SYSTEM_DIRS or any(v == t or v.startswith(t + "/") for t in _SYSTEM_TREES):
        raise ValueError(
            f"{value!r} is a system directory; use a directory of its own, e.g. /var/lib/pdboot"
        )
    why = sensitive_reason(v)
    if why is not None:
        raise ValueError(f"{value!r} {why}; use a directory of its own, e.g. /var/lib/pdboot")
    return v


# --------------------------------------------------------------------------- secrets

# Prefixes of real credentials (Hugging Face, OpenAI-style, GitHub, GitLab, Slack, AWS,
# NVIDIA, Replicate, JWTs): after env: / file: they mean the value itself was pasted.
_TOKEN_PREFIXES = (
    "hf_",
    "sk-",
    "sk_",
    "ghp_",
    "gho_",
    "ghs_",
    "ghu_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "akia",
    "eyj",
    "nvapi-",
    "r8_",
)


def looks_like_token(value: str) -> bool:
    """A credential by its shape: a known prefix followed by at least 12 characters."""
    low = value.lower()
    return any(low.startswith(p) and len(value) >= len(p) + 12 for p in _TOKEN_PREFIXES)


def looks_random(value: str) -> bool:
    """A long unbroken run of letters mixed with digits: variable and file names are words
    joined by _ - . or /, keys and tokens are not."""
    return any(
        len(run) >= 20 and not run.isdigit() and not run.isalpha()
        for run in re.findall(r"[A-Za-z0-9]+", value)
    )


_UPPER_WORDS = re.compile(r"[A-Z][A-Z0-9]{0,11}(_[A-Z0-9]{1,11})*")


def check_reference(value: str, *, bare_path: bool = False) -> str:
    """``env:NAME`` or ``file:/path`` (a bare path too when ``bare_path``), never a value."""
    pointer = " (the secret goes in that variable or file; the inventory names it)"
    if value.startswith("env:"):
        name = value[4:]
        if not _ENV_NAME.fullmatch(name):
            raise ValueError("env: reference must name an environment variable")
        # HF_TOKEN_STAGING is a name: upper-case words joined by _, as variables are written
        if (looks_like_token(name) and not _UPPER_WORDS.fullmatch(name)) or looks_random(name):
            raise ValueError("this looks like the secret itself, not a variable name" + pointer)
        return value
    if value.startswith("file:") or (bare_path and value.startswith(("/", "~", "./"))):
        path = value[5:] if value.startswith("file:") else value
        check_safe_path(path, "secret file path")
        if "/" not in path and (looks_like_token(path) or looks_random(path)):
            raise ValueError("this looks like the secret itself, not a file path" + pointer)
        return value
    raise ValueError("must be a reference (env:NAME or file:/path/to/file), never the value")


# Words in a variable name that mark it as a secret (split on _, so TOKENIZERS_... is fine).
_SECRET_WORDS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS", "CREDENTIAL"}
_SECRET_PAIRS = {("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"), ("SECRET", "KEY")}


def secret_env_name(name: str) -> bool:
    parts = name.upper().split("_")
    return bool(_SECRET_WORDS & set(parts)) or any(
        (a, b) in _SECRET_PAIRS for a, b in itertools.pairwise(parts)
    )


__all__ = [
    "LOCAL",
    "check_abs_path",
    "check_address",
    "check_env_name",
    "check_extra_args",
    "check_index_groups",
    "check_reference",
    "check_safe_path",
    "check_safe_token",
    "check_served_name",
    "check_size",
    "is_loopback_or_unspecified",
    "looks_like_token",
    "looks_random",
    "secret_env_name",
]


def check_index_groups(
    v: list[int] | list[list[int]], *, empty: str, group: str, ids: str, top: int
) -> None:
    """A flat list of indices, or one list per engine (GPU groups, CPU cores): not empty, no
    empty group, no index twice, each in 0..top. ``empty``: the whole message for an empty
    list; ``group`` and ``ids`` name the parts in the other messages."""
    if not v:
        raise ValueError(empty)
    groups = [g if isinstance(g, list) else [g] for g in v]
    if isinstance(v[0], list) and any(not g for g in groups):
        raise ValueError(f"a {group} must not be empty")
    flat = [i for g in groups for i in g]
    if len(set(flat)) != len(flat):
        raise ValueError(f"{ids} must be distinct")
    if any(i < 0 or i > top for i in flat):
        raise ValueError(f"{ids} must be 0..{top}")


# --------------------------------------------------------------------------- examples

# The ranges and names set aside for documentation (RFC 5737, RFC 3849, RFC 2606): the
# examples use them, and no real host has one.
_DOC_NETS = tuple(
    ipaddress.ip_network(n)
    for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
_DOC_DOMAINS = ("example", "example.com", "example.net", "example.org", "test", "invalid")


def is_documentation_address(address: str) -> bool:
    """An address or name from the documentation ranges: an example left unedited."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        name = address.lower().rstrip(".")
        return any(name == d or name.endswith("." + d) for d in _DOC_DOMAINS)
    return any(ip in net for net in _DOC_NETS)
