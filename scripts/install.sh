#!/bin/sh
# Install slurmbox on this Debian 12/13 machine (as root): Debian packages,
# a venv at $PREFIX/venv with slurmbox, the SPANK shim and the launcher, and a
# non-root user for tests and the demo. Idempotent.
set -eu
PREFIX=${SLURMBOX_PREFIX:-/opt/slurmbox}
REPO=$(cd "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" != 0 ]; then echo "install.sh: run as root" >&2; exit 1; fi
export DEBIAN_FRONTEND=noninteractive
# One install at a time: concurrent runs would interleave pip and apt in the same venv.
exec 9>/run/lock/slurmbox-install.lock
flock 9
if ! dpkg -s slurm-wlm slurmd slurmctld munge libslurm-dev runsc python3-venv iproute2 util-linux gcc \
        rdma-core python3-pyverbs infiniband-diags ibverbs-utils >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq slurm-wlm slurmd slurmctld munge libslurm-dev runsc python3-venv python3-dev \
        iproute2 util-linux gcc procps rdma-core python3-pyverbs infiniband-diags ibverbs-utils >/dev/null
fi
if [ ! -x "$PREFIX/venv/bin/python3" ]; then
    /usr/bin/python3 -m venv "$PREFIX/venv"
fi
"$PREFIX/venv/bin/pip" install -q --upgrade pip >/dev/null 2>&1 || true
"$PREFIX/venv/bin/pip" install -q "$REPO[test,nvidia]"
# pyverbs is Debian's build against the system rdma-core (python3-pyverbs): link only it into the venv.
SITE=$("$PREFIX/venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -d /usr/lib/python3/dist-packages/pyverbs ]; then ln -sfn /usr/lib/python3/dist-packages/pyverbs "$SITE/pyverbs"; fi
"$PREFIX/venv/bin/slurmbox" plugin install --prefix "$PREFIX"
chmod 755 "$PREFIX" "$PREFIX/venv" "$PREFIX/lib" "$PREFIX/libexec"
id sbxuser >/dev/null 2>&1 || useradd --create-home --shell /bin/bash sbxuser
id sbxother >/dev/null 2>&1 || useradd --create-home --shell /bin/bash sbxother
ln -sf "$PREFIX/venv/bin/slurmbox" /usr/local/bin/slurmbox
echo "slurmbox installed under $PREFIX"
