"""The fixed parts of `pdboot export slurm`'s batch script: its shell functions (start a step,
stage the weights, wait as `up` waits, tear down). pdboot/export/slurm.py writes the
deployment's part around them, and only the runtime's own start functions (shellcheck
finds no function that is never called). Kept as text here so the generator stays readable;
every value the plan gives is quoted there.
"""

PRELUDE = r"""
set -uo pipefail
log() { printf '%s pdboot: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { log "$*"; exit 1; }

LOG_DIR="${PDBOOT_LOG_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/pdboot-logs/$SLURM_JOB_ID}"
mkdir -p "$LOG_DIR" || die "cannot create $LOG_DIR"
# the proxy's nginx.conf and (written by its container) the key's include: this job's only,
# on the first node, 0700, removed with the job
PROXY_DIR=$(mktemp -d "${TMPDIR:-/tmp}/pdboot-proxy.XXXXXX") || die "cannot create a folder in /tmp"
# the router's and the proxy's own secrets (own_secret, with an API key): this job's only,
# on the first node, 0700, removed with the job
OWN_SECRETS=$(mktemp -d "${TMPDIR:-/tmp}/pdboot-secrets.XXXXXX") ||
  die "cannot create a folder in /tmp"
PIDS=()
KEYS=()
STAGING=()

# Job end (time limit, scancel) or a failure: stop every step. Slurm also signals the steps
# itself; each step removes its own container (STEP below), so nothing outlives the job.
# shellcheck disable=SC2317 # run by the traps below
teardown() {
  trap - EXIT TERM INT HUP
  log "tearing down ${#PIDS[@]} steps"
  local pid
  for pid in "${STAGING[@]}" "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  wait
  rm -rf "$PROXY_DIR" "$OWN_SECRETS"
  log "torn down"
}
trap 'teardown; exit 143' TERM INT HUP
trap teardown EXIT

# Node roles: the allocation's nodes in order play HOSTS; each host's address is the one
# Slurm reaches its node by (NodeAddr), which is also where its engines' side channels bind.
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
((${#NODES[@]} >= ${#HOSTS[@]})) ||
  die "the allocation has ${#NODES[@]} nodes; this deployment needs ${#HOSTS[@]}"
ADDR=()
URLHOST=() # the address as a URL's host: an IPv6 one in brackets
for i in "${!HOSTS[@]}"; do
  ADDR[i]=$(scontrol show node "${NODES[i]}" -o | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
  [[ -n ${ADDR[i]} ]] || ADDR[i]=${NODES[i]}
  URLHOST[i]=${ADDR[i]}
  [[ ${ADDR[i]} != *:* ]] || URLHOST[i]="[${ADDR[i]}]"
  log "host ${HOSTS[i]} is node ${NODES[i]} (${ADDR[i]})"
done
USED=$(IFS=,; echo "${NODES[*]:0:${#HOSTS[@]}}")
# this script runs on the first node, the router's: it reaches the router on the loopback,
# clients reach the proxy on the node's address
ROUTER_URL="http://127.0.0.1:$ROUTER_PORT"
ENDPOINT_URL="http://${URLHOST[0]}:$ENDPOINT_PORT"

if ((NEEDS_SECRETS)); then
  # only whether it is readable, on every node: the containers read it, this script never
  srun --overlap --input=none --nodes=${#HOSTS[@]} --ntasks-per-node=1 -w "$USED" \
    test -r "$SECRETS_FILE" || die "secrets file $SECRETS_FILE is not readable on every node"
fi

run_step() { # node-index key argv...: one job step on that node, in the background ($!)
  local node=$1 key=$2
  shift 2
  srun --overlap --input=none --nodes=1 --ntasks=1 -w "${NODES[node]}" \
    --output="$LOG_DIR/$key.log" "$@" &
}
"""

DOCKER = r"""
# One step per container. Under Docker the container belongs to the node's dockerd, not to
# the step: the step's shell removes it when Slurm (or teardown) signals the step.
# shellcheck disable=SC2016 # expanded by the step's own shell
STEP='name=$1; shift
stop() { docker rm -f "$name" >/dev/null 2>&1; }
trap "stop; exit 143" TERM INT HUP
trap stop EXIT
"$@" &
wait $!'

start_docker() { # n node-index key container-name argv...: a service
  local n=$1 node=$2 key=$3 name=$4
  shift 4
  run_step "$node" "$key" bash -c "$STEP" pdboot-step "$name" "$@"
  PIDS[n]=$!
  KEYS[n]=$key
  log "started $key on ${NODES[node]} (log: $LOG_DIR/$key.log)"
}
"""

DOCKER_STAGE = r"""
stage_docker() { # node-index key container-name argv...: the weights step of one node
  local node=$1 key=$2 name=$3
  shift 3
  run_step "$node" "$key" bash -c "$STEP" pdboot-step "$name" "$@"
  STAGING+=("$!")
  STAGE_KEYS+=("$key")
  log "staging the weights on ${NODES[node]} (log: $LOG_DIR/$key.log)"
}
"""

PYXIS = r"""
start_pyxis() { # n node-index key srun-container-options... -- argv...: a service
  local n=$1 node=$2 key=$3
  shift 3
  run_step "$node" "$key" "$@"
  PIDS[n]=$!
  KEYS[n]=$key
  log "started $key on ${NODES[node]} (log: $LOG_DIR/$key.log)"
}
"""

PYXIS_STAGE = r"""
stage_pyxis() { # node-index key srun-container-options... -- argv...: the weights step
  local node=$1 key=$2
  shift 2
  run_step "$node" "$key" "$@"
  STAGING+=("$!")
  STAGE_KEYS+=("$key")
  log "staging the weights on ${NODES[node]} (log: $LOG_DIR/$key.log)"
}
"""

STAGE_WAIT = r"""
STAGE_KEYS=()
wait_staged() { # every node's weights step ends 0 (hash-checked) before any engine starts
  local i
  for i in "${!STAGING[@]}"; do
    wait "${STAGING[i]}" || die "${STAGE_KEYS[i]} failed; see $LOG_DIR/${STAGE_KEYS[i]}.log"
    log "${STAGE_KEYS[i]}: the weights are on the node"
  done
  STAGING=()
}
"""

WAITS = r"""
http_ok() { curl -fsS -o /dev/null --max-time 5 "$1" 2>/dev/null; }

alive() { # n: its step still runs (an exit stops the wait at once, as in `up`)
  kill -0 "${PIDS[$1]}" 2>/dev/null ||
    die "${KEYS[$1]} exited before it was ready; see $LOG_DIR/${KEYS[$1]}.log"
}

wait_engine() { # n key url: /health answers 200 before the engines' common deadline
  local n=$1 key=$2 url=$3
  until http_ok "$url"; do
    alive "$n"
    ((SECONDS < ENGINES_DEADLINE)) || die "$key not ready after ${READY_SECONDS}s ($url)"
    sleep 2
  done
  log "$key ready ($url)"
}

wait_health() { # n what url: /health answers within the router's ready timeout
  local deadline=$((SECONDS + ROUTER_READY_SECONDS))
  until http_ok "$3"; do
    alive "$1"
    ((SECONDS < deadline)) || die "$2 not ready after ${ROUTER_READY_SECONDS}s ($3)"
    sleep 1
  done
  log "$2 ready ($3)"
}

healthy_workers() {
  curl -fsS --max-time 5 "$ROUTER_URL/workers" 2>/dev/null | python3 -c '
import json, sys
try:
    print(sum(1 for w in json.load(sys.stdin).get("workers", []) if w.get("is_healthy")))
except ValueError:
    print(0)'
}

wait_workers() { # n: every engine registered healthy in the router's /workers, as `up` waits
  local deadline=$((SECONDS + ROUTER_READY_SECONDS)) healthy=0
  until healthy=$(healthy_workers) && ((healthy >= WORKERS)); do
    alive "$1"
    ((SECONDS < deadline)) ||
      die "router has ${healthy:-0} of $WORKERS workers healthy after ${ROUTER_READY_SECONDS}s"
    sleep 1
  done
  log "router ready: $healthy workers healthy"
}
"""

# Only with live workers: MODEL_ID_JSON is set then.
ADD_WORKER = r"""
add_worker() { # url prefill|decode: the router was started to take its workers at runtime
  # on the loopback, the worker API's only way in (the proxy answers 404 there); model_id
  # named: the router cannot read it from an engine that checks an API key
  curl -fsS -o /dev/null --max-time 30 -H 'Content-Type: application/json' \
    -d "{\"url\":\"$1\",\"worker_type\":\"$2\",\"model_id\":$MODEL_ID_JSON}" \
    "$ROUTER_URL/workers" ||
    die "the router refused worker $1 ($2)"
  log "registered $2 worker $1"
}
"""

RUN = r"""
ENDPOINT="$ENDPOINT_URL/v1"
log "ready: $ENDPOINT (OpenAI-compatible, via the proxy and the router)"
echo "$ENDPOINT" >"$LOG_DIR/endpoint"

# Serve until the job ends (time limit, scancel: teardown) or a service exits (then the
# deployment is broken: the job ends, and teardown stops the rest).
wait -n "${PIDS[@]}"
for n in "${!PIDS[@]}"; do
  kill -0 "${PIDS[n]}" 2>/dev/null || log "${KEYS[n]} exited; see $LOG_DIR/${KEYS[n]}.log"
done
exit 1
"""

# Only with an API key: the router and the proxy read their own copies of it.
OWN_SECRET = r"""
own_secret() { # NAME file: the secrets file's last NAME= line alone, into a 0600 file of this
  # job's on this node (the router's and the proxy's, which see nothing else: never HF_TOKEN).
  # File to file: the value never enters this script or its log
  (umask 077 && grep "^$1=" "$SECRETS_FILE" | tail -n 1 >"$OWN_SECRETS/$2") ||
    die "secrets file $SECRETS_FILE has no $1= line"
}
"""  # noqa: S105 - a shell function, no secret
