"""llm-d's shape of the same deployment (optional): a LeaderWorkerSet DisaggregatedSet
(``disaggregatedset.x-k8s.io/v1``, LWS >= 0.10 with ``enableDisaggregatedSet=true``) whose
prefill and decode roles run the pods `export k8s` writes, with the same `vllm serve`
arguments. Its router is llm-d's (the Gateway API Inference Extension's endpoint picker),
which this file does not configure: docs/export.md says so."""

from __future__ import annotations

from typing import Any

from pdboot.export.common import ExportError, dns_label, label_value
from pdboot.export.k8s import LABEL_DEPLOYMENT, LABEL_ROLE, engine_workload
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import Plan


def disaggregated_set(
    inv: Inventory, plan: Plan, namespace: str, download_at_start: bool = False
) -> dict[str, Any]:
    roles = []
    for tier, tier_engines in (("prefill", plan.prefill_engines), ("decode", plan.decode_engines)):
        if any(s.dp_role for s in tier_engines):
            raise ExportError(
                f"the {tier} tier is data-parallel across hosts: its ranks need per-host "
                "arguments that one LWS worker template cannot give; export it without --llm-d"
            )
        # every engine of a tier runs the same arguments but its port and side channel, which
        # are the same in every pod of `export k8s`: the tier's first engine is its template
        # (with its weights' init container: apply engines.yaml's stage ConfigMap first)
        workload = engine_workload(
            inv, plan, tier_engines[0], namespace, download_at_start=download_at_start
        )
        template = workload["spec"]["template"]
        template["spec"].pop("nodeSelector", None)  # LWS places the replicas
        template["metadata"]["labels"] = {
            LABEL_DEPLOYMENT: label_value(plan.deployment),
            LABEL_ROLE: tier,
        }
        roles.append(
            {
                "name": tier,
                "spec": {
                    "replicas": len(tier_engines),
                    "rolloutStrategy": {
                        "rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0}
                    },
                    "leaderWorkerTemplate": {"size": 1, "workerTemplate": template},
                },
            }
        )
    return {
        "apiVersion": "disaggregatedset.x-k8s.io/v1",
        "kind": "DisaggregatedSet",
        "metadata": {
            "name": dns_label(plan.deployment),
            "namespace": namespace,
            "labels": {LABEL_DEPLOYMENT: label_value(plan.deployment)},
        },
        "spec": {"slices": 1, "roles": roles},
    }
