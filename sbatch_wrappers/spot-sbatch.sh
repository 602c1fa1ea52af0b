#!/bin/sh
# Submit a batch script to a spot (preemptible) partition, ready to be preempted,
# checkpointed, requeued and restored by slurmbox -- one line instead of five options:
#
#   sh spot-sbatch.sh [--steps] [--checkpoint=transparent|signal[:SIG]|none] [sbatch options] SCRIPT [ARGS...]
#
# It adds: --partition=$SLURMBOX_SPOT_PARTITION (default spot), --requeue (the job goes
# back to the queue when preempted or its node is reclaimed), --open-mode=append (Slurm
# would truncate the output files on requeue), --sandbox (checkpoints are of gVisor
# sandboxes) and --sandbox-checkpoint=MODE (default transparent: the whole sandbox is saved
# and restored, the program needs no change; signal: the program gets SIGUSR1, or SIG,
# saves its own state and exits, and starts again after the requeue). Options given later
# on the command line, or #SBATCH lines in the script, win over these.
# --steps: the batch script itself is not sandboxed; its `srun --sandbox` steps (one task
# per node) are checkpointed and restored instead; the mode reaches them through the
# environment (SLURMBOX_SANDBOX_CHECKPOINT), which sbatch exports to the job.
# See sbatch_wrappers/README.md.
set -eu
mode=transparent
steps=no
while :; do
    case "${1:-}" in
        --checkpoint=*) mode=${1#--checkpoint=}; shift ;;
        --steps) steps=yes; shift ;;
        *) break ;;
    esac
done
if [ $# -eq 0 ]; then
    echo "usage: spot-sbatch.sh [--steps] [--checkpoint=transparent|signal[:SIG]|none] [sbatch options] SCRIPT [ARGS...]" >&2
    exit 2
fi
if [ "$steps" = yes ]; then
    SLURMBOX_SANDBOX_CHECKPOINT=$mode exec sbatch --partition="${SLURMBOX_SPOT_PARTITION:-spot}" --requeue \
        --open-mode=append "$@"
fi
exec sbatch --partition="${SLURMBOX_SPOT_PARTITION:-spot}" --requeue --open-mode=append --sandbox \
    --sandbox-checkpoint="$mode" "$@"
