"""The README `pdboot export k8s` writes beside the manifests: the steps they need first
(node labels, the Secret), the weights, the endpoint (pure)."""

from __future__ import annotations

import shlex

from pdboot.export.common import dns_label, endpoint_port, engines, label_value
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import API_KEY_VARS, HF_TOKEN_VARS, Plan

LABEL_HOST = "pdboot.io/host"


def shell_value(ref: str) -> str:
    """The operator's shell reading a secret reference's value (never the value itself):
    ``env:HF_TOKEN`` -> ``"$HF_TOKEN"``, ``file:/path`` (or a bare path) -> ``"$(cat /path)"``."""
    if ref.startswith("env:"):
        return f'"${ref[4:]}"'
    path = ref[5:] if ref.startswith("file:") else ref
    return f'"$(cat {shlex.quote(path)})"'


def secret_literals(inv: Inventory) -> list[str]:
    """``--from-literal`` of each variable `up` writes into secrets.env, its value read from
    where the inventory says (both HF names from secrets.hf_token, both key names from
    secrets.api_key)."""
    s = inv.secrets
    pairs: list[tuple[str, str]] = []
    if s.hf_token is not None:
        pairs += [(n, s.hf_token) for n in HF_TOKEN_VARS]
    if s.api_key is not None:
        pairs += [(n, s.api_key) for n in API_KEY_VARS]
    pairs += list(s.env.items())
    return [f"--from-literal={n}={shell_value(ref)}" for n, ref in pairs]


def readme(inv: Inventory, plan: Plan, namespace: str, secret: str, weights: str) -> str:
    hosts = sorted({s.host for s in (*engines(plan), plan.router)})
    lines = [
        f"# {plan.deployment}: Kubernetes manifests from `pdboot export k8s`",
        "",
        f"The {weights[0].lower()}{weights[1:]}.",
        "",
        "Before `kubectl apply -f .`:",
        "",
        "1. Label the node that plays each inventory host (pods are pinned by this label):",
        "",
        *[f"       kubectl label node NODE {LABEL_HOST}={label_value(h)}" for h in hosts],
    ]
    literals = secret_literals(inv)
    if literals:
        lines += [
            "",
            "2. Create the Secret the engines, the router and the proxy read, from your own",
            "   shell (each value read where the inventory's secrets say):",
            "",
            f"       kubectl -n {namespace} create secret generic {secret} \\",
            *[f"         {x} \\" for x in literals[:-1]],
            f"         {literals[-1]}",
            "",
            "   Its values are never in these files.",
        ]
    lines += [
        "",
        f"Endpoint: the Service {dns_label(plan.deployment, 'router')}:{endpoint_port(plan)} "
        "(OpenAI-compatible, /v1): pdboot's proxy beside the router, the only port the "
        "Service reaches (the router's worker API stays on the pod's loopback).",
        "Not carried over: preflight's checks, `pdboot up`'s KV proof and gate, `pdboot watch`.",
        "",
    ]
    return "\n".join(lines)
