"""slurmbox measure in Slurm mode: each candidate is a sandboxed step of the user's allocation.

Runs on the real dev cluster (conftest's ``cluster`` fixture) as the test
user, through ``salloc`` and ``srun --sandbox``.
"""

import json
import os
import pwd
import shutil

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "measure")
PREFIX = os.environ.get("SLURMBOX_PREFIX", "/opt/slurmbox")


def _stage(workdir, names):
    entry = pwd.getpwnam("sbxuser")
    for name in names:
        target = os.path.join(workdir, name + ".py")
        shutil.copyfile(os.path.join(DATA, name + ".py"), target)
        os.chown(target, entry.pw_uid, entry.pw_gid)


def test_slurm_mode_measures_in_sandboxed_steps_and_flags_a_cheat(cluster, workdir):
    _stage(workdir, ["matmul_task", "honest", "exploit_cache", "exploit_read_submit_dir"])
    slurmbox = os.path.join(PREFIX, "venv", "bin", "slurmbox")
    result = cluster.run(["salloc", "-N1", "-n1", slurmbox, "measure", "run", "--mode", "slurm",
                          "--task", "matmul_task.py", "--candidate", "honest.py", "--candidate", "exploit_cache.py",
                          "--candidate", "exploit_read_submit_dir.py",
                          "--min-time", "0.05", "--max-wall", "3", "--out", "c.h5", "--json"],
                         cwd=workdir, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result.stdout[result.stdout.index("{"):])
    by = {c["label"]: c for c in data["candidates"]}
    assert by["honest"]["verdict"] == "accepted", by["honest"]["flags"]
    assert by["honest"]["sandbox"]["runtime"].startswith("slurm step")
    assert by["honest"]["summary"]["count"] >= 10
    assert "stale_output" in by["exploit_cache"]["flag_reasons"] and by["exploit_cache"]["reward_ns"] is None
    reader = by["exploit_read_submit_dir"]
    assert "incorrect_output" in reader["flag_reasons"] and reader["reward_ns"] is None
    from slurmbox.measure import records
    stored = {c["label"]: c for c in records.read_campaign(os.path.join(workdir, "c.h5"))["candidates"]}
    assert "FOUND 0" in stored["exploit_read_submit_dir"]["stderr"], stored["exploit_read_submit_dir"]["stderr"]
    assert not [e for e in os.listdir(workdir) if e.startswith(".slurmbox-measure-")]
    cluster.wait_for(lambda: not cluster.sandbox_processes(), timeout=60, what="the steps' sandboxes to end")
