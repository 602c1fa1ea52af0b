"""Profile limits (memory, pids, wall time) reach the sandbox and are enforced.

The dev cluster's site defines a ``limited`` profile: memory_limit_mb 192,
wall_limit 0:08 (8 s). See slurmbox.dev_cluster.cluster.
"""

import json
import time

ALLOCATE = """
blocks = []
for i in range(64):
    block = bytearray(16 * 1024 * 1024)
    block[::4096] = b"x" * 4096  # touch every page
    blocks.append(block)
    print("held", (i + 1) * 16, "MB", flush=True)
print("ALL-ALLOCATED", flush=True)
"""


def test_memory_limit_is_in_the_spec_and_kills_a_sandbox_that_exceeds_it(cluster, workdir):
    dry = cluster.srun("--sandbox=limited", "--sandbox-dry-run", "true", cwd=workdir)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["linux"]["resources"]["memory"] == {"limit": 192 * 1024 * 1024}
    unlimited = json.loads(cluster.srun("--sandbox", "--sandbox-dry-run", "true", cwd=workdir).stdout)
    assert "memory" not in unlimited["linux"]["resources"]

    result = cluster.srun("--sandbox=limited", "/usr/bin/python3", "-c", ALLOCATE, cwd=workdir, timeout=180)
    assert result.returncode != 0 and "ALL-ALLOCATED" not in result.stdout
    held = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("held")]
    assert held and max(held) < 192, result.stdout  # killed before holding more than the limit
    assert "Killed" in result.stderr, result.stderr

    fine = cluster.srun("--sandbox", "/usr/bin/python3", "-c", ALLOCATE.replace("64", "16"), cwd=workdir, timeout=180)
    assert fine.returncode == 0 and "ALL-ALLOCATED" in fine.stdout, fine.stderr


def test_wall_limit_kills_the_sandbox_with_a_message(cluster, workdir):
    started = time.monotonic()
    result = cluster.srun("--sandbox=limited", "sleep", "120", cwd=workdir, timeout=110)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "wall limit of 8 s was reached" in result.stderr, result.stderr
    assert elapsed < 100  # ended by the limit, not by sleep finishing
    cluster.wait_for(lambda: not cluster.step_dirs() and not cluster.sandbox_processes(),
                     what=lambda: "the sandbox to be torn down (%r)" % cluster.step_dirs())
