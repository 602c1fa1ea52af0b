"""slurmbox measure in Slurm mode: each candidate is a sandboxed step of the user's allocation.

Runs on the real dev cluster (conftest's ``cluster`` fixture) as the test
user, through ``salloc``/``sbatch`` and ``srun --sandbox``. The parsing of
the step cgroup's location (sandbox/step_cgroup.py) is tested on recorded
/proc texts of a cgroup v1 (hybrid) and a v2 node.
"""

import json
import os
import pwd
import shutil
import subprocess
import uuid

from slurmbox.sandbox import step_cgroup

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
    # salloc's shell runs on the submit host, not on a node: no cross-check, and the record says why.
    assert by["honest"]["sandbox"]["cpu_accounting"] == "off"
    assert "runs on node %s, the harness on" % by["honest"]["sandbox"]["node"] in \
        by["honest"]["sandbox"]["cpu_accounting_detail"], by["honest"]["sandbox"]
    assert "stale_output" in by["exploit_cache"]["flag_reasons"] and by["exploit_cache"]["reward_ns"] is None
    reader = by["exploit_read_submit_dir"]
    assert "incorrect_output" in reader["flag_reasons"] and reader["reward_ns"] is None
    from slurmbox.measure import records
    stored = {c["label"]: c for c in records.read_campaign(os.path.join(workdir, "c.h5"))["candidates"]}
    assert "FOUND 0" in stored["exploit_read_submit_dir"]["stderr"], stored["exploit_read_submit_dir"]["stderr"]
    assert set(stored["honest"]["samples"]["cpu_ns"].tolist()) == {-1}
    assert not [e for e in os.listdir(workdir) if e.startswith(".slurmbox-measure-")]
    cluster.wait_for(lambda: not cluster.sandbox_processes(), timeout=60, what="the steps' sandboxes to end")


def _batch_campaign(cluster, workdir, candidates, name):
    """Run ``slurmbox measure run --mode slurm`` in a batch script (the harness on a node); -> (JSON, job id)."""
    slurmbox = os.path.join(PREFIX, "venv", "bin", "slurmbox")
    args = [slurmbox, "measure", "run", "--mode", "slurm", "--task", "matmul_task.py", "--min-time", "0.05",
            "--max-wall", "3", "--out", name + ".h5", "--json"]
    for candidate in candidates:
        args += ["--candidate", candidate + ".py"]
    out = os.path.join(workdir, name + ".out")
    result = cluster.run(["sbatch", "--wait", "--parsable", "-N1", "-n1", "-o", out, "--wrap", " ".join(args)],
                         cwd=workdir, timeout=400)
    with open(out) as handle:
        text = handle.read()
    assert result.returncode == 0, result.stdout + result.stderr + text
    job = result.stdout.strip().split(";")[0]
    data = json.loads(text[text.index("{"):])
    return {c["label"]: c for c in data["candidates"]}, job


def _step_cgroups(names):
    """Directories named one of ``names`` in the cgroup tree (every v1 hierarchy, or the v2 tree)."""
    found = []
    for current, dirs, _files in os.walk(step_cgroup.CGROUP_ROOT):
        found += [os.path.join(current, d) for d in dirs if d in names]
        dirs[:] = [d for d in dirs if not d.startswith(step_cgroup.PREFIX) or d in names]
    return found


def test_slurm_mode_cross_checks_kernel_cpu_time_and_flags_work_after_done(cluster, workdir):
    _stage(workdir, ["matmul_task", "honest", "exploit_thread", "exploit_child"])
    by, job = _batch_campaign(cluster, workdir, ["honest", "exploit_thread", "exploit_child"], "cpu")
    honest = by["honest"]
    assert honest["verdict"] == "accepted", honest["flags"]
    sandbox = honest["sandbox"]
    assert sandbox["cpu_accounting"] == "on", sandbox.get("cpu_accounting_detail")
    assert sandbox["node"] == sandbox["harness_node"] and sandbox["step"].startswith(job + ".")
    assert os.path.basename(sandbox["cpu_accounting_file"]) in ("cpuacct.usage", "cpu.stat")
    assert step_cgroup.cgroup_name(job, sandbox["step"].split(".")[1], sandbox["node"], cluster.runtime_dir) in \
        sandbox["cpu_accounting_file"]
    from slurmbox.measure import records
    stored = {c["label"]: c for c in records.read_campaign(os.path.join(workdir, "cpu.h5"))["candidates"]}
    assert stored["honest"]["sandbox"]["cpu_accounting"] == "on"
    cpu = stored["honest"]["samples"]["cpu_ns"]
    assert len(cpu) >= 13 and cpu.min() > 0, cpu  # every sample, warm-up included, has the sandbox's CPU time
    assert stored["honest"]["samples"]["quiet_cpu_ns"].min() >= 0
    for label in ("exploit_thread", "exploit_child"):
        assert by[label]["sandbox"]["cpu_accounting"] == "on", by[label]["sandbox"]
        assert "work_after_done" in by[label]["flag_reasons"], (label, by[label]["flags"])
        assert by[label]["reward_ns"] is None
    # Each candidate had its own step and cgroup; runsc and the cleanup removed them all.
    steps = {c["sandbox"]["step"] for c in by.values()}
    assert len(steps) == 3
    names = {step_cgroup.cgroup_name(job, s.split(".")[1], sandbox["node"], cluster.runtime_dir) for s in steps}
    cluster.wait_for(lambda: not cluster.sandbox_processes(job), timeout=60, what="the steps' sandboxes to end")
    cluster.wait_for(lambda: not _step_cgroups(names), timeout=30,
                     what=lambda: "the steps' cgroups to be removed (%r)" % _step_cgroups(names))


def test_step_sandbox_has_its_own_cgroup_readable_by_its_user_and_removed_after_scancel(cluster, workdir):
    name = "cg-%s" % uuid.uuid4().hex[:6]
    env = cluster.env()
    srun = subprocess.Popen(["/usr/sbin/runuser", "-u", "sbxuser", "--", "/usr/bin/env", "-i"] +
                            ["%s=%s" % kv for kv in env.items()] +
                            ["srun", "--sandbox", "-N1", "-n1", "-J", name, "sleep", "300"],
                            cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def record():
            for step_dir in cluster.step_dirs():
                path = os.path.join(step_dir, "sandbox.json")
                if os.path.isfile(path):
                    with open(path) as handle:
                        return step_dir, json.load(handle)
            return None
        step_dir, data = cluster.wait_for(record, timeout=120, what="the step's sandbox record")
        account = data["cpu_accounting"]
        assert data["spec"]["linux"]["cgroupsPath"] == account["cgroups_path"]
        assert os.path.basename(os.path.dirname(account["file"])) == account["name"] == \
            step_cgroup.cgroup_name(data["job"], data["step"], data["node"], cluster.runtime_dir)
        assert account["cgroups_path"].endswith(account["name"] + "/sandbox")
        leaf = os.path.join(os.path.dirname(account["file"]), "sandbox", "cgroup.procs")
        cluster.wait_for(lambda: os.path.exists(leaf) and open(leaf).read().split(), timeout=60,
                         what="the sandbox's processes in its cgroup")
        assert oct(os.stat(os.path.dirname(account["file"])).st_mode & 0o777) == "0o755"
        # The job's user reads the counter (and the owner record), not root's record.
        read = cluster.run(["cat", account["file"], os.path.join(step_dir, "sandbox.owner.json")], cwd=workdir)
        assert read.returncode == 0 and int(read.stdout.split()[0] if not step_cgroup.is_v2() else
                                            read.stdout.split("usage_usec")[1].split()[0]) > 0, read.stderr
        other = cluster.run(["cat", os.path.join(step_dir, "sandbox.owner.json")], user="sbxother", cwd="/")
        assert other.returncode != 0
        assert cluster.run(["scancel", data["job"]], user="root").returncode == 0
        srun.wait(timeout=120)
        cluster.wait_for(lambda: not [d for d in account["dirs"] if os.path.isdir(d)], timeout=60,
                         what=lambda: "the step's cgroup to be removed (%r)" % account["dirs"])
        cluster.wait_for(lambda: not cluster.sandbox_processes(data["job"]), timeout=60, what="the sandbox to end")
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()


V1_CGROUP = """12:pids:/slurm/uid_1000/job_7/step_0/task_0
4:memory:/slurm/uid_1000/job_7/step_0/task_0
3:cpu,cpuacct:/slurm/uid_1000/job_7/step_0/task_0
1:name=systemd:/system.slice/slurmd.service
0::/system.slice/slurmd.service
"""
V1_MOUNTS = """25 24 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
31 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
32 25 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,memory
33 25 0:30 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,pids
"""
V2_CGROUP = "0::/system.slice/slurmstepd.scope/job_7/step_0/slurm\n"
V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_step_cgroup_on_cgroup_v1_nests_in_each_hierarchy_of_the_supervisor():
    name = step_cgroup.cgroup_name("7", "0", "n1", "/run/slurmbox")
    assert name.startswith("slurmbox-7.0-n1-") and name != step_cgroup.cgroup_name("7", "0", "n1", "/tmp/other")
    path = step_cgroup.cgroups_path(name, proc_cgroup=V1_CGROUP, v2=False)
    assert path == name + "/sandbox"  # relative: runsc joins it to its own cgroup in every hierarchy
    account = step_cgroup.accounting(path, proc_cgroup=V1_CGROUP, mountinfo=V1_MOUNTS, v2=False)
    task = "/slurm/uid_1000/job_7/step_0/task_0/"
    assert account["version"] == 1 and account["name"] == name
    assert account["file"] == "/sys/fs/cgroup/cpu,cpuacct" + task + name + "/cpuacct.usage"
    assert account["dirs"] == sorted(["/sys/fs/cgroup/cpu,cpuacct" + task + name, "/sys/fs/cgroup/memory" + task + name,
                                      "/sys/fs/cgroup/pids" + task + name,
                                      "/sys/fs/cgroup/systemd/system.slice/slurmd.service/" + name])


def test_step_cgroup_on_cgroup_v2_is_a_sibling_of_the_supervisors_cgroup():
    path = step_cgroup.cgroups_path("slurmbox-7.0-n1-x", proc_cgroup=V2_CGROUP, v2=True)
    step = "/system.slice/slurmstepd.scope/job_7/step_0/slurmbox-7.0-n1-x"
    assert path == step + "/sandbox"
    account = step_cgroup.accounting(path, proc_cgroup=V2_CGROUP, mountinfo=V2_MOUNTS, v2=True)
    assert account == {"cgroups_path": path, "name": "slurmbox-7.0-n1-x", "version": 2,
                       "dirs": ["/sys/fs/cgroup" + step], "file": "/sys/fs/cgroup" + step + "/cpu.stat"}
    assert step_cgroup.cgroups_path("s", proc_cgroup="0::/\n", v2=True) == "/s/sandbox"
    assert step_cgroup.accounting("", proc_cgroup=V2_CGROUP, mountinfo=V2_MOUNTS, v2=True) is None
    assert step_cgroup.accounting("/elsewhere", proc_cgroup=V2_CGROUP, mountinfo=V2_MOUNTS, v2=True) is None
    assert step_cgroup.accounting(path, proc_cgroup=V2_CGROUP, mountinfo="", v2=True) is None


def test_step_cgroup_names_are_safe_and_removal_stays_inside_the_cgroup_tree(tmp_path):
    assert "/" not in step_cgroup.cgroup_name("7", "0", "node/../x", "/run/slurmbox")
    outside = tmp_path / "slurmbox-7.0-n1"
    outside.mkdir()
    assert step_cgroup.remove([str(outside)], "slurmbox-7.0-n1") == []
    assert outside.is_dir()  # not under /sys/fs/cgroup: never touched


def test_steps_go_next_to_a_harness_on_a_node_unless_srun_args_choose_nodes(tmp_path, monkeypatch):
    from slurmbox.measure.slurm_step import SlurmStepCandidate
    if not shutil.which("srun"):
        import pytest
        pytest.skip("srun is not installed")
    monkeypatch.chdir(tmp_path)
    candidate = os.path.join(DATA, "honest.py")
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    plain = SlurmStepCandidate(candidate, "a")
    chosen = SlurmStepCandidate(candidate, "b", srun_args=["-wn2"])
    argv = plain.command()
    assert "--nodelist=n7" in argv and "--job-name=" + plain.step_name in argv
    assert not [a for a in chosen.command() if a.startswith("--nodelist")]
    assert plain.step_name != chosen.step_name
    monkeypatch.delenv("SLURMD_NODENAME")
    assert not [a for a in SlurmStepCandidate(candidate, "c").command() if a.startswith("--nodelist")]
