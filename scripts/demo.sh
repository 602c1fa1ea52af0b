#!/bin/sh
# Install slurmbox, start a two-node dev cluster and run the demo: a sandboxed
# batch job whose steps run on both nodes, and an interactive-style sandboxed
# step. Run as root on Debian 12 or 13. The cluster stays up afterwards.
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=${SLURMBOX_DEMO_DIR:-/tmp/slurmbox-dev}
bash "$REPO/scripts/install.sh"
if ! slurmbox dev-cluster status --dir "$DIR" >/dev/null 2>&1; then
    slurmbox dev-cluster up --nodes 2 --gpus-per-node 2 --dir "$DIR"
fi
export SLURM_CONF="$DIR/etc/slurm.conf"
WORK=/home/sbxuser/slurmbox-demo
mkdir -p "$WORK" && chown sbxuser:sbxuser "$WORK"
as_user() { runuser -u sbxuser -- env SLURM_CONF="$SLURM_CONF" PATH=/usr/local/bin:/usr/bin:/bin "$@"; }

cat > "$WORK/demo.sbatch" <<'JOB'
#!/bin/sh
#SBATCH --job-name=slurmbox-demo
#SBATCH --sandbox
#SBATCH --nodes=2 --ntasks=2
echo "batch step on $(hostname): kernel $(uname -r), $(dmesg | head -1)"
srun sh -c 'echo "step task $SLURM_PROCID on $(hostname) as uid $(id -u): $(dmesg | head -1)"'
srun --no-sandbox sh -c 'echo "unsandboxed step on $(hostname): kernel $(uname -r)"'
JOB
chown sbxuser:sbxuser "$WORK/demo.sbatch"
echo "== sbatch --sandbox (batch step and its srun steps in gVisor, on n1 and n2)"
cd "$WORK"
as_user sbatch --wait --output="$WORK/demo.out" "$WORK/demo.sbatch" >/dev/null
cat "$WORK/demo.out"
echo "== srun --sandbox (interactive-style step, one sandbox per node, two tasks per node)"
as_user srun --sandbox -N2 -n4 sh -c 'echo "task $SLURM_PROCID on $(hostname): $(dmesg | head -1)"' | sort
echo "== srun --sandbox --gres=gpu:1 --sandbox-dry-run: the bundle gets only the allocated GPU"
as_user srun --sandbox --gres=gpu:1 --sandbox-dry-run true 2>/dev/null | python3 -c \
    'import json,sys; s=json.load(sys.stdin); print([d["path"] for d in s["linux"]["devices"]], [e for e in s["process"]["env"] if e.startswith("CUDA_VISIBLE")])'
echo
echo "The dev cluster is still running. Try:  export SLURM_CONF=$SLURM_CONF; srun --sandbox --pty bash"
echo "Stop it with:                          slurmbox dev-cluster down --dir $DIR"
