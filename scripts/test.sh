#!/bin/sh
# Install slurmbox (idempotent) and run the whole test suite as root. The
# tests start their own two-node dev cluster (real slurmctld/slurmd/munge/runsc).
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${SLURMBOX_PREFIX:-/opt/slurmbox}
bash "$REPO/scripts/install.sh"
cd "$REPO"
exec "$PREFIX/venv/bin/python" -m pytest -p no:cacheprovider "$@" tests
