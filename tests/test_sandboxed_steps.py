"""Sandboxed steps through real srun/sbatch, real slurmctld/slurmd and real runsc."""

import json
import os
import pty
import select
import time

import pytest

GVISOR_BOOT = "Starting gVisor"


def test_dmesg_shows_gvisor_boot_only_with_sandbox(cluster, workdir):
    sandboxed = cluster.srun("--sandbox", "dmesg", cwd=workdir)
    plain = cluster.srun("sh", "-c", "dmesg 2>&1; true", cwd=workdir)
    assert sandboxed.returncode == 0, sandboxed.stderr
    assert GVISOR_BOOT in sandboxed.stdout
    assert GVISOR_BOOT not in plain.stdout


def test_tasks_on_one_node_share_a_sandbox_and_nodes_do_not(cluster, workdir):
    script = ('echo "$SLURM_PROCID" > /dev/shm/rank$SLURM_PROCID; sleep 2; '
              'python3 -c "import os; print(os.environ[\'SLURM_PROCID\'], os.uname().nodename, '
              'sorted(os.listdir(\'/dev/shm\')))"')
    result = cluster.srun("-N2", "-n4", "--ntasks-per-node=2", "--sandbox", "sh", "-c", script, cwd=workdir)
    assert result.returncode == 0, result.stderr
    seen = {}
    for line in result.stdout.splitlines():
        rank, node, files = line.split(" ", 2)
        seen[int(rank)] = (node, set(eval(files)))  # a list literal printed by Python
    assert sorted(seen) == [0, 1, 2, 3]
    by_node = {}
    for rank, (node, files) in seen.items():
        by_node.setdefault(node, set()).add(rank)
    assert len(by_node) == 2
    for node, ranks in by_node.items():
        expected = {"rank%d" % r for r in ranks}
        for rank in ranks:
            assert seen[rank][1] == expected, "rank %d on %s sees %s" % (rank, node, seen[rank][1])


def test_batch_step_and_its_steps_run_sandboxed(cluster, workdir):
    script = os.path.join(workdir, "job.sh")
    with open(script, "w") as handle:
        handle.write("#!/bin/sh\n#SBATCH --sandbox\n#SBATCH -N2 -n2\n"
                     "echo batch: $(dmesg | head -1)\n"
                     "srun -N2 -n2 sh -c 'echo step $(hostname): $(dmesg | head -1)'\n"
                     "srun --no-sandbox -N1 -n1 sh -c 'echo plain: $(dmesg 2>&1 | head -1)'\n"
                     "srun -N1 -n1 sh -c 'exit 5'; echo inner-exit=$?\n"
                     "srun -N1 -n1 sh -c 'echo to-file; echo to-stderr >&2' > redirected.txt 2>&1\n"
                     "echo piped | srun -N1 -n1 tr a-z A-Z\n")
    os.chmod(script, 0o755)
    output = os.path.join(workdir, "job.out")
    result = cluster.run(["sbatch", "-W", "-o", output, script], cwd=workdir)
    assert result.returncode == 0, result.stderr
    text = open(output).read()
    lines = text.splitlines()
    assert any(line.startswith("batch:") and GVISOR_BOOT in line for line in lines), text
    assert {line.split(":")[0] for line in lines if line.startswith("step ") and GVISOR_BOOT in line} == \
        {"step n1", "step n2"}, text
    plain = [line for line in lines if line.startswith("plain:")]
    assert plain and GVISOR_BOOT not in plain[0], text
    assert "inner-exit=5" in text
    assert "PIPED" in text and "to-file" not in text  # stdin and redirections of srun inside the sandbox
    assert open(os.path.join(workdir, "redirected.txt")).read().split() == ["to-file", "to-stderr"]
    assert os.stat(output).st_uid == os.stat(workdir).st_uid  # runsc must not re-own the job's output
    assert os.stat("/dev/null").st_uid == 0  # ... nor the node's /dev/null (slurmstepd gives it as stdin)


def test_no_sandbox_is_honoured_or_refused_by_partition_policy(cluster, workdir):
    honoured = cluster.srun("--no-sandbox", "sh", "-c", "dmesg 2>&1; true", cwd=workdir,
                            env={"SLURMBOX_SANDBOX": "1"})
    assert honoured.returncode == 0 and GVISOR_BOOT not in honoured.stdout
    marker = os.path.join(workdir, "ran")
    refused = cluster.srun("-p", "secure", "--no-sandbox", "touch", marker, cwd=workdir)
    assert refused.returncode != 0
    assert "--no-sandbox" in refused.stderr and "requires sandboxing" in refused.stderr
    assert not os.path.exists(marker)
    required = cluster.srun("-p", "secure", "dmesg", cwd=workdir)
    assert GVISOR_BOOT in required.stdout  # sandboxed without asking


def test_any_sandbox_option_implies_a_sandbox(cluster, workdir):
    result = cluster.srun("--sandbox-network=none", "dmesg", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert GVISOR_BOOT in result.stdout


def test_environment_fallback_and_command_line_precedence(cluster, workdir):
    by_env = cluster.srun("dmesg", cwd=workdir, env={"SLURMBOX_SANDBOX": "default"})
    assert GVISOR_BOOT in by_env.stdout
    bad_env = cluster.srun("--sandbox-network=none", "true", cwd=workdir,
                           env={"SLURMBOX_SANDBOX": "1", "SLURMBOX_SANDBOX_NETWORK": "bogus"})
    assert bad_env.returncode == 0, bad_env.stderr  # the command line wins over the environment


@pytest.mark.parametrize("command", [
    ["sh", "-c", "exit 0"], ["sh", "-c", "exit 1"], ["sh", "-c", "exit 7"],
    ["no-such-command-slurmbox"], ["sh", "-c", "kill -TERM $$"], ["sh", "-c", "kill -SEGV $$"],
    ["sh", "-c", "kill -KILL $$"],
])
def test_exit_status_is_what_slurm_records_without_sandbox(cluster, workdir, command):
    plain = cluster.srun(*command, cwd=workdir)
    sandboxed = cluster.srun("--sandbox", *command, cwd=workdir)
    assert sandboxed.returncode == plain.returncode
    plain_verdict = [line.split("task 0: ")[-1] for line in plain.stderr.splitlines() if "task 0:" in line]
    sandbox_verdict = [line.split("task 0: ")[-1] for line in sandboxed.stderr.splitlines() if "task 0:" in line]
    assert sandbox_verdict == plain_verdict


def _submit_sleeper(cluster, workdir, *extra):
    result = cluster.run(["sbatch", "--parsable", "-N2", "-n2", "--sandbox", *extra, "--wrap",
                          "srun sleep 300"], cwd=workdir)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def _job_output(workdir, job):
    try:
        return open(os.path.join(workdir, "slurm-%s.out" % job)).read()
    except OSError as err:
        return str(err)


def test_scancel_removes_every_process_and_all_sandbox_state(cluster, workdir):
    job = _submit_sleeper(cluster, workdir)
    cluster.wait_for(lambda: len([l for l in cluster.sandbox_processes(job) if "run --bundle" in l]) >= 3,
                     what=lambda: "batch and step sandboxes of job %s to run (state %s, output %r, processes %r)"
                     % (job, cluster.job_state(job), _job_output(workdir, job), cluster.sandbox_processes(job)))
    assert cluster.run(["scancel", job]).returncode == 0
    cluster.wait_for(lambda: cluster.job_state(job) == "GONE" or cluster.job_state(job) == "CANCELLED",
                     what="job %s to end" % job)
    cluster.wait_for(lambda: not cluster.sandbox_processes(job) and
                     not [d for d in cluster.step_dirs() if os.path.basename(d).startswith(job + ".")],
                     timeout=20, what="job %s's sandboxes to be cleaned up" % job)
    assert not [c for c in cluster.runsc_containers() if "slurmbox-%s." % job in c]


def test_time_limit_removes_every_process_and_all_sandbox_state(cluster, workdir):
    job = _submit_sleeper(cluster, workdir, "--time=0:05")
    cluster.wait_for(lambda: cluster.sandbox_processes(job), what="job %s to start" % job)
    cluster.wait_for(lambda: cluster.job_state(job) == "GONE" or cluster.job_state(job) == "TIMEOUT",
                     timeout=120, what="job %s to hit its time limit" % job)
    cluster.wait_for(lambda: not cluster.sandbox_processes(job) and
                     not [d for d in cluster.step_dirs() if os.path.basename(d).startswith(job + ".")],
                     timeout=30, what="job %s's sandboxes to be cleaned up" % job)


def test_job_user_identity_file_ownership_and_hidden_host_paths(cluster, workdir, user_ids):
    secret_dirs = ["/root", "/var/lib"]
    secrets = []
    for directory in secret_dirs:
        path = os.path.join(directory, "slurmbox-test-secret-%d" % os.getpid())
        with open(path, "w") as handle:
            handle.write("secret")
        os.chmod(path, 0o600)
        secrets.append(path)
    try:
        probe = ("import os, json; print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), "
                 "'visible': [p for p in %r if os.path.lexists(p)]})); open('written', 'w').write('x')" % secrets)
        result = cluster.srun("--sandbox", "python3", "-c", probe, cwd=workdir)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert (report["uid"], report["gid"]) == user_ids
        assert report["visible"] == []
        written = os.stat(os.path.join(workdir, "written"))
        assert (written.st_uid, written.st_gid) == user_ids
    finally:
        for path in secrets:
            os.unlink(path)


def _spec(cluster, workdir, *args):
    result = cluster.srun("--sandbox", "--sandbox-dry-run", *args, "true", cwd=workdir)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_gpu_bundle_lists_exactly_the_allocated_devices(cluster, workdir):
    devdir = os.path.join(cluster.dev.dir, "dev")
    one = _spec(cluster, workdir, "--gres=gpu:1")
    paths = sorted(d["path"] for d in one["linux"]["devices"])
    assert paths == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert "CUDA_VISIBLE_DEVICES=0" in one["process"]["env"]
    assert one["annotations"]["org.slurmbox.devices"].split(",") == [devdir + "/nvidiactl", devdir + "/nvidia0"]
    minor = {d["path"]: d["minor"] for d in one["linux"]["devices"]}
    assert minor["/dev/nvidia0"] == os.minor(os.stat(devdir + "/nvidia0").st_rdev)
    both = _spec(cluster, workdir, "--gres=gpu:2")
    assert sorted(d["path"] for d in both["linux"]["devices"]) == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"]
    none = _spec(cluster, workdir)
    assert none["linux"]["devices"] == []


def test_gpu_step_fails_clearly_when_runsc_has_no_gpu_proxy(cluster, workdir):
    from slurmbox.sandbox import runsc

    caps = runsc.capabilities(runsc.find_runsc(), os.path.join(cluster.runtime_dir, "n1"))
    if "nvproxy" in caps["flags"]:
        pytest.skip("this runsc has nvproxy; the fake GPUs are not real NVIDIA devices")
    marker = os.path.join(workdir, "ran")
    result = cluster.srun("--sandbox", "--gres=gpu:1", "touch", marker, cwd=workdir)
    assert result.returncode != 0
    assert "--nvproxy" in result.stderr
    assert not os.path.exists(marker)


def test_interactive_pty_step_runs_inside_gvisor(cluster, workdir):
    env = cluster.env(TERM="dumb")
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(workdir)
        os.execvpe("runuser", ["runuser", "-u", "sbxuser", "--", "env"] + ["%s=%s" % kv for kv in env.items()] +
                   ["srun", "--sandbox", "--pty", "bash", "--norc", "--noprofile", "-i"], env)
    output = b""

    def read_until(token, timeout=60):
        nonlocal output
        deadline = time.monotonic() + timeout
        while token not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    output += os.read(fd, 4096)
                except OSError:
                    break
        return token in output

    try:
        _converse(fd, read_until)
    except BaseException:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert b"TTY True" in output
    assert GVISOR_BOOT.encode() in output
    assert os.waitstatus_to_exitcode(status) == 3


def _converse(fd, read_until):
    assert read_until(b"$ "), "no prompt from bash inside the sandbox"
    os.write(fd, b"python3 -c 'import os; print(\"TTY\", os.isatty(0))'; dmesg | head -1; echo DONE-$((6*7))\n")
    assert read_until(b"DONE-42"), "the command did not run"
    os.write(fd, b"exit 3\n")


@pytest.mark.parametrize("option, value, needle", [
    ("--sandbox", "nosuchprofile", "unknown profile"),
    ("--sandbox-mounts", "relative:/data", "not absolute"),
    ("--sandbox-mounts", "/tmp:/data:rx", "not ro or rw"),
    ("--sandbox-image", "/no/such/rootfs", "cannot open /no/such/rootfs (No such file or directory)"),
    ("--sandbox-network", "nonee", "expected one of none|sandbox|host"),
])
def test_bad_options_fail_before_the_program_starts(cluster, workdir, option, value, needle):
    marker = os.path.join(workdir, "ran")
    before = set(cluster.step_dirs()) | set(cluster.runsc_containers())
    extra = [] if option == "--sandbox" else ["--sandbox"]
    result = cluster.srun(*extra, "%s=%s" % (option, value), "touch", marker, cwd=workdir)
    assert result.returncode != 0
    assert option in result.stderr and value in result.stderr and needle in result.stderr, result.stderr
    assert not os.path.exists(marker)
    def leftovers():
        return (set(cluster.step_dirs()) | set(cluster.runsc_containers())) - before

    cluster.wait_for(lambda: not leftovers(), timeout=20,
                     what=lambda: "the failed step to leave nothing behind: %s" % sorted(leftovers()))


def test_multi_prog_is_refused_where_spank_cannot_wrap_it(cluster, workdir):
    version = cluster.run(["srun", "--version"]).stdout.split()[-1]
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) >= (23, 11):
        pytest.skip("Slurm %s wraps --multi-prog tasks with spank_prepend_task_argv" % version)
    conf = os.path.join(workdir, "multi.conf")
    with open(conf, "w") as handle:
        handle.write("0 touch %s/ran0\n1 touch %s/ran1\n" % (workdir, workdir))
    result = cluster.srun("-n2", "--sandbox", "--multi-prog", conf, cwd=workdir)
    assert result.returncode != 0
    assert "--multi-prog" in result.stderr and "23.11" in result.stderr
    assert not os.path.exists(os.path.join(workdir, "ran0"))
