"""`slurmbox sandbox ls|inspect|kill` against real sandboxed jobs of the dev cluster."""

import json
import os
import re

import pytest

from conftest import OTHER_USER, PREFIX, TEST_USER

SLURMBOX = os.path.join(PREFIX, "venv", "bin", "slurmbox")


def _slurmbox(cluster, *args, user="root"):
    return cluster.run([SLURMBOX, "sandbox", *args], user=user)


def _listing(cluster, user="root"):
    result = _slurmbox(cluster, "ls", "--json", user=user)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _job_record(cluster, job):
    line = cluster.run(["scontrol", "-o", "show", "job", job], user="root").stdout
    return dict(re.findall(r"(\w+)=(\S*)", line))


@pytest.fixture
def sleeper(cluster, workdir):
    """A sandboxed batch job of the test user whose step 0 sleeps, with both sandboxes running."""
    result = cluster.run(["sbatch", "--parsable", "-N1", "--sandbox", "--wrap", "srun sleep 300"], cwd=workdir)
    assert result.returncode == 0, result.stderr
    job = result.stdout.strip().split(";")[0]
    cluster.wait_for(lambda: {e["id"]: e["state"] for e in _listing(cluster)}.get(job + ".0") == "running",
                     what=lambda: "step %s.0's sandbox to run (listing %r)" % (job, _listing(cluster)))
    yield job
    cluster.run(["scancel", job], user="root")
    cluster.wait_for(lambda: not [d for d in cluster.step_dirs() if os.path.basename(d).startswith(job + ".")],
                     timeout=60, what="job %s's sandboxes to be cleaned up" % job)


def test_root_lists_every_sandbox_with_job_step_user_node_age_and_state(cluster, sleeper):
    entries = {e["id"]: e for e in _listing(cluster) if e["job"] == sleeper}
    assert set(entries) == {sleeper + ".batch", sleeper + ".0"}
    step = entries[sleeper + ".0"]
    assert (step["step"], step["user"], step["state"]) == ("0", TEST_USER, "running")
    assert step["node"] == entries[sleeper + ".batch"]["node"] in cluster.dev.node_names
    assert step["age_s"] >= 0
    table = _slurmbox(cluster, "ls").stdout
    assert re.search(r"^%s\.0\s+%s\s+0\s+%s\s" % (sleeper, sleeper, TEST_USER), table, re.M), table


def test_owner_sees_own_sandboxes_and_other_users_see_none(cluster, sleeper):
    mine = {e["id"] for e in _listing(cluster, user=TEST_USER)}
    assert {sleeper + ".batch", sleeper + ".0"} <= mine
    theirs = _listing(cluster, user=OTHER_USER)
    assert not [e for e in theirs if e["job"] == sleeper]
    refused = _slurmbox(cluster, "inspect", sleeper + ".0", user=OTHER_USER)
    assert refused.returncode != 0 and "no sandbox %s.0 that you may see" % sleeper in refused.stderr


def test_inspect_shows_spec_devices_and_mounts_but_not_the_task_environment(cluster, sleeper):
    for user in ("root", TEST_USER):
        result = _slurmbox(cluster, "inspect", sleeper + ".0", user=user)
        assert result.returncode == 0, result.stderr
        record = json.loads(result.stdout)
        assert record["id"] == sleeper + ".0" and record["user"] == TEST_USER
        assert record["spec"]["process"]["args"][-2:] == ["sleep", "300"] or "sleep" in record["spec"]["process"]["args"][0]
        assert "env" not in record["spec"]["process"]
        assert record["spec"]["process"]["user"]["uid"] == record["uid"] != 0
        assert record["devices"] == []  # the job asked for no GPUs
        assert record["network"] == "none" and record["platform"]


def test_kill_is_root_only_and_the_job_sees_an_ordinary_failure(cluster, sleeper):
    refused = _slurmbox(cluster, "kill", sleeper + ".0", user=TEST_USER)
    assert refused.returncode != 0 and "only root may kill" in refused.stderr
    assert _job_record(cluster, sleeper)["JobState"] == "RUNNING"

    node = {e["id"]: e["node"] for e in _listing(cluster)}[sleeper + ".0"]
    killed = _slurmbox(cluster, "kill", sleeper + ".0", "--reason", "test kill")
    assert killed.returncode == 0, killed.stderr
    cluster.wait_for(lambda: _job_record(cluster, sleeper)["JobState"] in ("FAILED", "COMPLETED"),
                     what=lambda: "job %s to end after the kill (%r)" % (sleeper, _job_record(cluster, sleeper)))
    record = _job_record(cluster, sleeper)
    assert record["JobState"] == "FAILED" and record["ExitCode"] != "0:0", record
    cluster.wait_for(lambda: not cluster.sandbox_processes(sleeper) and
                     not [d for d in cluster.step_dirs() if os.path.basename(d).startswith(sleeper + ".")],
                     timeout=60, what="job %s's sandboxes to be cleaned up" % sleeper)
    assert not [c for c in cluster.runsc_containers() if "slurmbox-%s." % sleeper in c]
    log = os.path.join(cluster.runtime_dir, node, "log", sleeper + ".0.log")
    assert "test kill" in open(log).read()


def test_unknown_or_malformed_ids_fail_with_a_message(cluster):
    missing = _slurmbox(cluster, "inspect", "999999.0")
    assert missing.returncode != 0 and "no sandbox 999999.0" in missing.stderr
    malformed = _slurmbox(cluster, "kill", "../etc")
    assert malformed.returncode != 0 and "JOB.STEP" in malformed.stderr


def test_owner_listing_failures_are_sandbox_errors_not_tracebacks(tmp_path, monkeypatch):
    """No cluster: a uid without a user name, or a Slurm client failing half-way, is a SandboxError."""
    from slurmbox.sandbox import registry
    from slurmbox.slurm_client import scontrol

    unknown = 4000000
    with pytest.raises(KeyError):
        __import__("pwd").getpwuid(unknown)
    with pytest.raises(registry.SandboxError, match="uid %d has no user name" % unknown):
        registry.list_sandboxes(str(tmp_path), uid=unknown)

    def fake_run(argv, env=None, timeout=30):
        return "1234 n[1-2]\n" if "-s" not in argv else "1234.0 n[1-2]\n"

    def failing_expand(expression, env=None):
        raise scontrol.SlurmCommandError("scontrol show hostnames %s failed" % expression)
    monkeypatch.setattr(scontrol, "run_command", fake_run)
    monkeypatch.setattr(scontrol, "expand_hostlist", failing_expand)
    with pytest.raises(registry.SandboxError, match="cannot list your jobs: scontrol show hostnames"):
        registry.list_sandboxes(str(tmp_path), uid=os.getuid() or 1)
