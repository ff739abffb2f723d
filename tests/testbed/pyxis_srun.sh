#!/bin/bash
# An EMULATION of pyxis for the testbed's Slurm, which has no pyxis/enroot: installed as
# `srun` ahead of the real one on the node that runs the batch script, it turns a step's
# pyxis options into a `docker run` of the same image on the node the step lands on, so the
# exported pyxis script's order, readiness waits and teardown run on a real Slurm.
#
#   --container-image=IMAGE        docker run IMAGE (the testbed's registry)
#   --container-mounts=A:B[:ro],.. one -v per mount
#   --no-container-entrypoint      --entrypoint "" (the command runs as given); without it
#                                  the image's entrypoint goes in front, as on sites whose
#                                  pyxis runs entrypoints
#   --no-container-mount-home      nothing to do (docker mounts no home)
#   -- COMMAND...                  the container's command
#
# Not emulated: enroot's image import and squashfs cache, running as the submitting user,
# the job's environment inside the container (the exported commands set theirs with `env`).
# A step without --container-image goes to the real srun untouched.
set -euo pipefail
REAL_SRUN=${PDBOOT_REAL_SRUN:-/usr/bin/srun}

image=""
for a in "$@"; do
  [[ $a == --container-image=* ]] && image=${a#--container-image=}
  [[ $a == -- ]] && break
done
[[ -n $image ]] || exec "$REAL_SRUN" "$@"

srun_args=()
mounts=""
entrypoint=1
while (($#)); do
  case $1 in
  --container-image=*) ;;
  --container-mounts=*) mounts=${1#--container-mounts=} ;;
  --no-container-entrypoint) entrypoint=0 ;;
  --no-container-mount-home) ;;
  --)
    shift
    break
    ;;
  *) srun_args+=("$1") ;;
  esac
  shift
done

name="pyxis-emu-${SLURM_JOB_ID:-0}-$$-$RANDOM"
docker=(docker run --rm --name "$name" --network host --ipc host
  --label "io.pdboot.slurm-job=${SLURM_JOB_ID:-0}" --label io.pdboot.pyxis-emulation=1)
if [[ -n $mounts ]]; then
  IFS=, read -r -a parts <<<"$mounts"
  for m in "${parts[@]}"; do docker+=(-v "$m"); done
fi
((entrypoint)) || docker+=(--entrypoint "")
docker+=("$image" "$@")

# as the exported Docker steps do: the step's shell removes its container when signalled
# shellcheck disable=SC2016 # expanded by the step's own shell
step='name=$1; shift
stop() { docker rm -f "$name" >/dev/null 2>&1; }
trap "stop; exit 143" TERM INT HUP
trap stop EXIT
"$@" &
wait $!'
exec "$REAL_SRUN" "${srun_args[@]}" bash -c "$step" pdboot-step "$name" "${docker[@]}"
