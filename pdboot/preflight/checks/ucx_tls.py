"""``rdma.ucx_tls``: a kv_transfer.ucx.tls (UCX_TLS) that cannot work on GPU engine hosts,
judged from the value alone, before any engine starts (where it would fail as a bare
NIXL_ERR_BACKEND at the first transfer).

UCX_TLS is a comma list of transports and aliases, or ``^list`` for all but those (UCX's
documentation, FAQ "Which transports does UCX use?"): ``all``; ``tcp``; ``self``;
``sm``/``shm`` (posix, sysv, cma, knem, xpmem); ``cuda`` (cuda_copy, cuda_ipc, gdr_copy)
and those three by name; ``ib`` (every InfiniBand transport); the aliases ``rc`` (rc_verbs
and rc_mlx5, UD for the connection handshake), ``rc_v`` / ``rc_x``, ``ud``, ``ud_v`` /
``ud_x``, ``dc`` / ``dc_x``; and the raw transports ``rc_verbs``, ``rc_mlx5``,
``ud_verbs``, ``ud_mlx5``, ``dc_mlx5``. Three values cannot work:

- no cuda_copy on a GPU host: UCX does not see GPU memory, NIXL cannot register the KV
  cache in VRAM (log: "'cuda_copy' is not available");
- RC named raw (rc_verbs, rc_mlx5) with nothing to carry its wireup messages (no UD, DC,
  TCP or alias that brings one): the endpoint between the engines cannot be connected
  ("no auxiliary transport" / "no active messages transport");
- no transport between hosts (only self, shared memory, cuda) while the other tier's
  engines are on other hosts.

Pure: no command runs; the value comes from the inventory (HostContext.ucx_tls).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdboot.preflight.checks import CheckResult, Command, HostContext

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

CHECK_ID = "rdma.ucx_tls"
GPU_MEMORY = {"cuda", "cuda_copy"}
# what can carry RC's connection handshake (an active-message transport), aliases included
AUX = {"ud", "ud_v", "ud_x", "ud_verbs", "ud_mlx5", "rc", "rc_v", "rc_x", "dc", "dc_x"}
AUX |= {"dc_mlx5", "ib", "tcp"}
RAW_RC = {"rc_verbs", "rc_mlx5"}
BETWEEN_HOSTS = AUX | RAW_RC
FIX_EXAMPLE = "e.g. kv_transfer.ucx.tls: rc,cuda_copy (RDMA) or tcp,cuda_copy, or leave it unset"


def commands(ctx: HostContext) -> list[Command]:
    return []


def names(tls: str) -> tuple[bool, set[str]]:
    """(an exclusion list ``^...``, the names in it)."""
    excluded = tls.startswith("^")
    return excluded, {t.strip().lower() for t in tls.lstrip("^").split(",") if t.strip()}


def verdict(tls: str, remote_peers: bool) -> CheckResult:
    excluded, listed = names(tls)
    if excluded:  # everything but these
        if listed & GPU_MEMORY:
            return CheckResult(
                CHECK_ID,
                "fail",
                f"UCX_TLS={tls} excludes {', '.join(sorted(listed & GPU_MEMORY))}: UCX does "
                "not see GPU memory, so NIXL cannot register the KV cache in VRAM",
                f"do not exclude cuda_copy ({FIX_EXAMPLE})",
            )
        return CheckResult(CHECK_ID, "pass", f"UCX_TLS={tls}")
    if "all" in listed:
        return CheckResult(CHECK_ID, "pass", f"UCX_TLS={tls}")
    problems = []
    if not listed & GPU_MEMORY:
        problems.append(
            "no cuda_copy (or cuda): UCX does not see GPU memory, so NIXL cannot register "
            "the KV cache in VRAM"
        )
    if listed & RAW_RC and not listed & AUX:
        problems.append(
            f"{', '.join(sorted(listed & RAW_RC))} without UD, DC or TCP: RC needs an "
            "active-message transport for its connection handshake, so the endpoint between "
            "the engines cannot be set up ('no auxiliary transport')"
        )
    elif remote_peers and not listed & BETWEEN_HOSTS:
        problems.append(
            "no transport between hosts (only self, shared memory or cuda), and the other "
            "tier's engines are on other hosts"
        )
    if problems:
        return CheckResult(CHECK_ID, "fail", f"UCX_TLS={tls}: " + "; ".join(problems), FIX_EXAMPLE)
    return CheckResult(CHECK_ID, "pass", f"UCX_TLS={tls}")


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    """GPU engine hosts with kv_transfer.ucx.tls set (device: cpu hosts: cpu.ucx_tcp)."""
    if ctx.ucx_tls is None or not ctx.gpus_here or ctx.device == "cpu":
        return []
    return [verdict(ctx.ucx_tls, remote_peers=bool(ctx.peers))]
