"""The trust boundary: user-controlled input never steers root-run code, and a
sandbox is reachable only by its own job's user."""

import glob
import os
import subprocess



EVIL_SO = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    char path[512];
    snprintf(path, sizeof(path), "%s/marker-preload-%d", MARKER_DIR, (int)geteuid());
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}
"""


def _plant(workdir):
    """PYTHONPATH, LD_PRELOAD and PATH payloads that leave marker-*-EUID files."""
    pydir = os.path.join(workdir, "pyhook")
    bindir = os.path.join(workdir, "bin")
    os.makedirs(pydir)
    os.makedirs(bindir)
    hook = "import os\nopen(os.path.join(%r, 'marker-python-%%d' %% os.geteuid()), 'w').close()\n" % workdir
    for name in ("sitecustomize.py", "usercustomize.py", "json.py", "argparse.py"):
        with open(os.path.join(pydir, name), "w") as handle:
            handle.write(hook)
    for tool in ("runsc", "scontrol", "python3", "python", "gcc", "sh"):
        path = os.path.join(bindir, tool)
        with open(path, "w") as handle:
            handle.write("#!/bin/sh\ntouch %s/marker-path-$(id -u)\nexec /usr/bin/%s \"$@\"\n" % (workdir, tool))
        os.chmod(path, 0o755)
    source = os.path.join(workdir, "evil.c")
    with open(source, "w") as handle:
        handle.write(EVIL_SO)
    library = os.path.join(workdir, "evil.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-DMARKER_DIR=\"%s\"" % workdir, "-o", library, source], check=True)
    os.chmod(workdir, 0o777)
    return {"PYTHONPATH": pydir, "LD_PRELOAD": library, "PATH": bindir + ":/usr/local/bin:/usr/bin:/bin",
            "PYTHONSTARTUP": os.path.join(pydir, "sitecustomize.py"), "PYTHONHOME": pydir}


def test_planted_environment_never_runs_in_root_run_code(cluster, workdir):
    planted = _plant(workdir)
    for args in (["--sandbox", "true"], ["--sandbox", "--gres=gpu:1", "--sandbox-dry-run", "true"],
                 ["-N2", "-n2", "--sandbox", "true"]):
        result = cluster.srun(*args, cwd=workdir, env=planted)
        assert result.returncode == 0, (args, result.stderr)
    markers = sorted(os.path.basename(p) for p in glob.glob(os.path.join(workdir, "marker-*")))
    assert not [m for m in markers if m.endswith("-0")], "root-run code executed planted code: %s" % markers
    assert "marker-preload-%d" % os.stat(workdir).st_uid in markers  # the payload is live for the user's own code


def test_another_user_cannot_reach_a_running_sandbox(cluster, workdir):
    result = cluster.run(["sbatch", "--parsable", "--sandbox", "--wrap", "sleep 300"], cwd=workdir)
    job = result.stdout.strip()
    try:
        step_dir = cluster.wait_for(
            lambda: [d for d in cluster.step_dirs() if os.path.basename(d) == "%s.batch" % job],
            what="job %s's sandbox" % job)[0]
        socket_path = os.path.join(step_dir, "supervisor.sock")
        probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
                 "try:\n    s.connect(%r)\nexcept OSError as e:\n    print('refused', e.errno); sys.exit(0)\n"
                 "s.sendall(b'\\0\\0\\0\\2{}'); print('answer', s.recv(4096))\n" % socket_path)
        other = cluster.run(["python3", "-c", probe], user="sbxother", cwd="/")
        assert other.stdout.startswith("refused"), other.stdout + other.stderr
    finally:
        cluster.run(["scancel", job])


def test_mount_sources_the_user_cannot_read_are_refused(cluster, workdir):
    result = cluster.srun("--sandbox", "--sandbox-mounts=/root:/data:ro", "true", cwd=workdir)
    assert result.returncode != 0
    assert "--sandbox-mounts" in result.stderr and "may not read /root" in result.stderr


def test_no_sandbox_is_refused_for_a_step_joining_a_job_on_a_required_partition(cluster, workdir):
    # The forged SLURM_JOB_PARTITION is overridden by stock srun itself, so this checks the refusal for
    # steps joining such a job; a modified client that forges it is what the shim's slurmctld lookup stops.
    job = cluster.run(["sbatch", "--parsable", "-p", "secure", "--wrap", "sleep 120"], cwd=workdir).stdout.strip()
    try:
        cluster.wait_for(lambda: cluster.job_state(job) == "RUNNING", what="job %s to run" % job)
        marker = os.path.join(workdir, "escaped")
        result = cluster.srun("--jobid=%s" % job, "--overlap", "--no-sandbox", "touch", marker, cwd=workdir,
                              env={"SLURM_JOB_PARTITION": "ondemand"})
        assert result.returncode != 0
        assert "requires sandboxing" in result.stderr
        assert not os.path.exists(marker)
    finally:
        cluster.run(["scancel", job])


# -- red team classes (issue: close the ways out of a required sandbox) ----------------------------------------

import pytest  # noqa: E402

#: Job names and comments that pose as other fields of `scontrol show job` (spaces, newlines, '=', non-ASCII).
HOSTILE_TEXT = ["x Partition=ondemand", "x\nPartition=ondemand", "Partition=ondemand", "é Partition=ondemand é",
                "a=b Partition=ondemand Nodes=n2 GRES=gpu:h100:2(IDX:0-1)", " Partition=ondemand\n JobState=X"]


@pytest.mark.parametrize("field", ["-J", "--comment"])
@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_user_set_text_never_moves_a_step_off_a_required_partition(cluster, workdir, field, text):
    """The kernel release inside gVisor is 4.4.0; on the node it is the host's."""
    host_release = os.uname().release
    escaped = cluster.srun("-p", "secure", field, text, "--no-sandbox", "uname", "-r", cwd=workdir)
    assert escaped.returncode != 0 and host_release not in escaped.stdout
    assert "requires sandboxing" in escaped.stderr
    inside = cluster.srun("-p", "secure", field, text, "uname", "-r", cwd=workdir)
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.strip() != host_release and inside.stdout.strip()
    loosened = cluster.srun("-p", "secure", field, text, "--sandbox-network=host", "true", cwd=workdir)
    assert loosened.returncode != 0 and "--sandbox-network" in loosened.stderr


@pytest.mark.parametrize("env, name", [
    ({"SLURM_JOB_GPUS": "0"}, "x Nodes=n2 GRES=gpu:h100:2(IDX:0-1)"),
    ({"SLURM_STEP_GPUS": "0,1"}, "x\nNodes=n2 GRES=gpu:h100:2(IDX:0-1)"),
    ({"SLURM_JOB_GPUS": "0-1", "SLURM_STEP_GPUS": "1"}, "Nodes=n[1-2] GRES=gpu:h100:2(IDX:0-1)"),
])
def test_a_job_without_gpus_gets_no_gpu_whatever_its_name_and_environment_claim(cluster, workdir, env, name):
    result = cluster.srun("-w", "n2", "-J", name, "--sandbox-dry-run", "true", cwd=workdir, env=env)
    assert result.returncode == 0, result.stderr
    assert "nvidia" not in result.stdout


def test_a_forged_index_beyond_the_steps_gpus_is_not_granted(cluster, workdir):
    result = cluster.srun("-w", "n2", "--gres=gpu:1", "-J", "x GRES=gpu:h100:2(IDX:0-1)", "--sandbox-dry-run",
                          "sh", cwd=workdir, env={"SLURM_JOB_GPUS": "0,1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.count('"/dev/nvidia') == 2  # nvidiactl and the one allocated GPU


BROKER_SCRIPT = """#!/bin/sh
for opts in "--prolog=/bin/sh $PWD/pro.sh" "--task-prolog=$PWD/pro.sh" "--epilog=$PWD/pro.sh" \\
            "--jobid=1 --overlap --no-sandbox" "--jobi=1" "--container=$PWD" "--bcast=/tmp/b" "-M other" \\
            "--no-sandbox" "--pro=$PWD/pro.sh"; do
    srun $opts touch $PWD/escaped-option 2>>$PWD/refusals; echo "rc=$?" >> $PWD/codes
done
SLURM_TASK_PROLOG=$PWD/pro.sh SLURM_PROLOG=$PWD/pro.sh srun -n1 true; echo "env rc=$?" >> $PWD/codes
"""


def test_the_step_broker_refuses_every_option_outside_its_allowlist(cluster, workdir):
    with open(os.path.join(workdir, "pro.sh"), "w") as handle:
        handle.write("#!/bin/sh\ntouch %s/escaped-prolog\n" % workdir)
    script = os.path.join(workdir, "job.sh")
    with open(script, "w") as handle:
        handle.write(BROKER_SCRIPT)
    for path in (script, os.path.join(workdir, "pro.sh")):
        os.chmod(path, 0o755)
    os.chmod(workdir, 0o777)
    result = cluster.run(["sbatch", "--parsable", "--wait", "-p", "secure", "-o", os.path.join(workdir, "out"),
                          script], cwd=workdir, timeout=300)
    assert result.returncode == 0, result.stderr
    codes = open(os.path.join(workdir, "codes")).read().split("\n")
    assert codes[:10] == ["rc=125"] * 10, codes
    assert codes[10] == "env rc=0", codes
    refusals = open(os.path.join(workdir, "refusals")).read()
    for option in ("--prolog", "--task-prolog", "--epilog", "--jobid", "--jobi", "--container", "--bcast", "-M",
                   "--pro"):
        assert "srun option %s " % option in refusals
    assert "requires sandboxing" in refusals
    assert not [p for p in os.listdir(workdir) if p.startswith("escaped")]


@pytest.mark.parametrize("config", ["0 uname -r", "0 uname -r\n", "0\tuname -r", "0-0 uname -r\r\n",
                                    "# c\n\n  * uname -r", "0 uname -r\n# end"])
def test_multi_prog_on_a_required_partition_is_refused_in_every_shape(cluster, workdir, config):
    path = os.path.join(workdir, "mp.conf")
    with open(path, "w") as handle:
        handle.write(config)
    result = cluster.srun("-p", "secure", "--multi-prog", path, cwd=workdir)
    assert result.returncode != 0
    assert os.uname().release not in result.stdout
    assert "--multi-prog" in result.stderr


@pytest.mark.parametrize("destination", ["/etc/slurmbox-probe", "/slurmbox-probe/sub/deeper", "/usr/slurmbox-probe",
                                         "/var/slurmbox-probe"])
def test_mounts_never_create_paths_on_the_node(cluster, workdir, destination):
    before_root, before_etc = sorted(os.listdir("/")), sorted(os.listdir("/etc"))
    result = cluster.srun("--sandbox", "--sandbox-mounts=%s:%s:ro" % (workdir, destination), "true", cwd=workdir)
    assert result.returncode != 0 and "does not exist" in result.stderr
    assert not os.path.lexists(destination) and not os.path.lexists("/slurmbox-probe")
    assert sorted(os.listdir("/")) == before_root and sorted(os.listdir("/etc")) == before_etc


def test_a_mount_at_an_existing_directory_works(cluster, workdir):
    with open(os.path.join(workdir, "data.txt"), "w") as handle:
        handle.write("payload\n")
    result = cluster.srun("--sandbox", "--sandbox-mounts=%s:/mnt:ro" % workdir, "cat", "/mnt/data.txt", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "payload\n"


def test_device_directories_and_device_nodes_are_refused_as_mount_sources(cluster, workdir):
    devdir = os.path.join(cluster.dev.dir, "dev")
    for source in (devdir, cluster.dev.dir, os.path.join(devdir, "nvidia0")):
        result = cluster.srun("--sandbox", "--sandbox-mounts=%s:/mnt:ro" % source, "true", cwd=workdir)
        assert result.returncode != 0, source
        assert "--sandbox-mounts" in result.stderr, result.stderr


@pytest.mark.parametrize("argv", [["echo", "300"], ["echo", "0-1"], ["echo", "*"]])
def test_two_word_commands_that_are_not_multi_prog_configurations_still_run(cluster, workdir, argv):
    result = cluster.srun("-p", "secure", *argv, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert result.stdout == argv[1] + "\n"


def _step_dirs_of(cluster, job):
    return [d for d in cluster.step_dirs() if os.path.basename(d).startswith("%s." % job)]


@pytest.mark.parametrize("option", ["mounts", "image", "workdir", "network", "checkpoint", "checkpoint-interval"])
def test_a_step_that_cannot_start_says_why_exits_nonzero_and_leaves_nothing(cluster, workdir, option):
    """Refused before the supervisor starts (an over-long option value: the shim's own limit)."""
    result = cluster.srun("--sandbox-%s=%s" % (option, "/" + "a" * 5000), "-J", "too-long", "true", cwd=workdir)
    assert result.returncode == 125, result.stderr
    assert "--sandbox-%s" % option in result.stderr and "the step did not start" in result.stderr
    assert "Plugin initialization failed" not in result.stderr
    jobs = cluster.run(["squeue", "-h", "-a", "-t", "all", "-n", "too-long", "-o", "%A"]).stdout.split()
    assert not [d for job in jobs for d in _step_dirs_of(cluster, job)]


def test_a_batch_step_refused_by_the_supervisor_fails_the_job_with_the_reason(cluster, workdir):
    result = cluster.run(["sbatch", "--parsable", "-o", "out.txt", "--sandbox-mounts=%s:/no/such/dir" % workdir,
                          "--wrap", "touch ran"], cwd=workdir)
    assert result.returncode == 0, result.stderr
    job = result.stdout.strip()
    cluster.wait_for(lambda: cluster.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() in ("", "FAILED"),
                     timeout=120, what="job %s to end" % job)
    record = cluster.run(["scontrol", "-o", "show", "job", job]).stdout
    assert "ExitCode=125:0" in record or not record, record
    with open(os.path.join(workdir, "out.txt")) as handle:
        output = handle.read()
    assert "--sandbox-mounts" in output and "does not exist" in output
    assert not os.path.exists(os.path.join(workdir, "ran"))
    cluster.wait_for(lambda: not _step_dirs_of(cluster, job), what="job %s's step directories to go" % job)


def test_each_step_incarnation_gets_its_own_root_made_directory_behind_a_root_alias(cluster, workdir):
    import re
    import stat
    result = cluster.run(["sbatch", "--parsable", "--sandbox", "--wrap", "sleep 300"], cwd=workdir)
    job = result.stdout.strip()
    try:
        alias = cluster.wait_for(lambda: [d for d in cluster.step_dirs() if os.path.basename(d) == "%s.batch" % job
                                          and os.path.exists(os.path.join(d, "sandbox.json"))],
                                 what="job %s's sandbox" % job)[0]
        info = os.lstat(alias)
        assert stat.S_ISLNK(info.st_mode) and info.st_uid == 0
        target = os.readlink(alias)
        assert re.fullmatch(r"%s\.batch\.r0-[0-9a-f]{12}" % job, target), target
        real = os.path.join(os.path.dirname(alias), target)
        info = os.lstat(real)
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o710
        parent = os.stat(os.path.dirname(real))
        assert parent.st_uid == 0 and stat.S_IMODE(parent.st_mode) == 0o711  # no one else can create names
        import json
        with open(os.path.join(real, "sandbox.json")) as handle:
            container = json.load(handle)["container"]
        assert container == "slurmbox-" + target  # the container id carries the incarnation too
        state_root = os.path.join(os.path.dirname(real), "runsc")
        cluster.wait_for(lambda: os.path.isdir(state_root) and [n for n in os.listdir(state_root) if n == container
                                                                or n.startswith(container + "_")],
                         what="runsc state of %s" % container)
    finally:
        cluster.run(["scancel", job])
    cluster.wait_for(lambda: not _step_dirs_of(cluster, job), what="job %s's step directory and alias to go" % job)


SWAPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
a, b = sys.argv[1].encode(), sys.argv[2].encode()
open(sys.argv[3], "w").close()  # started
while not os.path.exists(sys.argv[4]):
    libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
"""


@pytest.mark.parametrize("kind", ["mounts", "cwd"])
def test_swapping_a_path_for_a_symlink_never_mounts_what_the_user_cannot_read(cluster, workdir, kind):
    """The red team's renameat2(RENAME_EXCHANGE) race on a mount source and on the working
    directory (the image goes through the same user_paths.open_source and staging)."""
    import pwd
    import shutil
    import tempfile
    other = pwd.getpwnam("sbxother")
    victim = tempfile.mkdtemp(prefix="slurmbox-victim-", dir="/tmp")
    os.chmod(victim, 0o755)
    private = os.path.join(victim, "home")
    os.makedirs(os.path.join(private, "bin"))
    for path in (os.path.join(private, "secret.txt"), os.path.join(private, "bin", "secret.txt")):
        with open(path, "w") as handle:
            handle.write("SECRET of sbxother\n")
        os.chmod(path, 0o644)
    os.chown(private, other.pw_uid, other.pw_gid)
    os.chmod(private, 0o700)
    mine = os.path.join(workdir, "d")
    os.makedirs(os.path.join(mine, "bin"))
    for path in (os.path.join(mine, "secret.txt"), os.path.join(mine, "bin", "secret.txt")):
        with open(path, "w") as handle:
            handle.write("mine\n")
    subprocess.run(["chown", "-R", "sbxuser:sbxuser", mine], check=True)
    link = os.path.join(workdir, "l")
    os.symlink(private, link)
    with open(os.path.join(workdir, "swap.py"), "w") as handle:
        handle.write(SWAPPER)
    started, stop = os.path.join(workdir, "started"), os.path.join(workdir, "stop")
    swapper = subprocess.Popen(["/usr/sbin/runuser", "-u", "sbxuser", "--", "python3", os.path.join(workdir, "swap.py"),
                                mine, link, started, stop])
    try:
        cluster.wait_for(lambda: os.path.exists(started) or swapper.poll() is not None, what="the swapper")
        args = {"mounts": ["--sandbox-mounts=%s:/mnt:ro" % mine, "cat", "/mnt/secret.txt"],
                "cwd": ["cat", "secret.txt"]}[kind]
        outputs = []
        for _ in range(12):
            result = cluster.srun("--sandbox", *args, cwd=mine if kind == "cwd" else workdir)
            outputs.append(result.stdout + result.stderr)
        assert swapper.poll() is None, "the swapper stopped early"
    finally:
        open(stop, "w").close()
        swapper.wait(timeout=30)
        shutil.rmtree(victim, ignore_errors=True)
    assert not [o for o in outputs if "SECRET" in o], outputs
    assert [o for o in outputs if "mine" in o or "cannot" in o or "No such" in o or "Permission" in o]


from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_FUZZ_OPTIONS = ["mounts", "image", "workdir", "network", "checkpoint", "checkpoint-interval", "dry-run"]
_FUZZ_TEXT = st.lists(st.sampled_from(list("/:,=. -_\nxé*$\t") + ["..", "/etc", "/mnt", ":ro", ":rw", "host",
                                                                   "sandbox", "none", "Partition=", "/dev"]),
                      max_size=12).map("".join)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(option=st.sampled_from(_FUZZ_OPTIONS), value=_FUZZ_TEXT, name=_FUZZ_TEXT)
def test_fuzzed_sandbox_options_and_job_names_are_refused_clearly_or_stay_inside(cluster, workdir, option, value,
                                                                                  name):
    host_release = os.uname().release
    before_root, before_etc = sorted(os.listdir("/")), sorted(os.listdir("/etc"))
    result = cluster.srun("-p", "secure", "-J", name or "x", "--sandbox-%s=%s" % (option, value), "uname", "-r",
                          cwd=workdir, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    assert host_release not in result.stdout.split(), (option, value, name, result.stdout)
    if result.returncode != 0:
        assert "slurmbox" in result.stderr or result.stderr.startswith("srun: "), result.stderr
    assert sorted(os.listdir("/")) == before_root and sorted(os.listdir("/etc")) == before_etc
    cluster.wait_for(lambda: not [d for d in cluster.step_dirs()], timeout=60, what="step directories to go")


@pytest.mark.parametrize("target", ["/proc", "/sys", "/dev/pts", "/proc/self"])
def test_a_symlink_to_a_kernel_file_system_is_refused_on_what_was_opened(cluster, workdir, target):
    """The red team bound the node's /proc by swapping the source between root's check and the
    open; a plain symlink is the same input without the race (the check is on the descriptor)."""
    link = os.path.join(workdir, "src")
    os.symlink(target, link)
    result = cluster.srun("-p", "secure", "--sandbox-mounts=%s:/mnt:ro" % link, "cat", "/mnt/kallsyms",
                          cwd=workdir)
    assert result.returncode != 0
    assert "--sandbox-mounts" in result.stderr and ("kernel's" in result.stderr or "system directory" in
                                                    result.stderr), result.stderr


@pytest.mark.parametrize("option, hidden, missing", [
    ("mounts", "{private}/secret.txt:/mnt/x", "{private}/nothing.txt:/mnt/x"),
    ("image", "{private}/sub", "{private}/nothing"),
    ("workdir", "{private}/sub", "{private}/nothing"),
    ("workdir", "/etc/ssl/private", "/etc/ssl/private/nothing"),  # root:ssl-cert 0710 on Debian
])
def test_refusals_never_tell_whether_a_path_the_user_cannot_search_exists(cluster, workdir, option, hidden,
                                                                         missing):
    import shutil
    import tempfile
    import pwd
    other = pwd.getpwnam("sbxother")
    base = tempfile.mkdtemp(prefix="slurmbox-probe-", dir="/tmp")
    os.chmod(base, 0o755)
    private = os.path.join(base, "private")
    os.makedirs(os.path.join(private, "sub"))
    with open(os.path.join(private, "secret.txt"), "w") as handle:
        handle.write("SECRET\n")
    os.chown(private, other.pw_uid, other.pw_gid)
    os.chmod(private, 0o700)
    os.makedirs(os.path.join(workdir, "d"))
    subprocess.run(["chown", "-R", "sbxuser:sbxuser", os.path.join(workdir, "d")], check=True)
    try:
        answers = []
        for value in (hidden, missing):
            value = value.format(private=private, work=workdir)
            result = cluster.srun("--sandbox", "--sandbox-%s=%s" % (option, value), "true", cwd=workdir)
            assert result.returncode != 0, (value, result.stderr)
            answers.append(result.stderr.replace(value, "VALUE").replace("nothing.txt", "secret.txt"))
        assert answers[0] == answers[1], answers
        assert "SECRET" not in answers[0]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_heterogeneous_job_sandboxes_exactly_its_required_partitions_component(cluster, workdir):
    """The shim reads each component's partition by its own job id among squeue's lines."""
    host_release = os.uname().release
    result = cluster.srun("-p", "ondemand", "-n1", "uname", "-r", ":", "-p", "secure", "-n1", "uname", "-r",
                          cwd=workdir)
    assert result.returncode == 0, result.stderr
    releases = result.stdout.split()
    assert len(releases) == 2 and releases.count(host_release) == 1, result.stdout  # gVisor reports its own
    escaped = cluster.srun("-p", "ondemand", "-n1", "true", ":", "-p", "secure", "-n1", "--no-sandbox", "uname", "-r",
                           cwd=workdir)
    assert escaped.returncode != 0 and host_release not in escaped.stdout
    assert "requires sandboxing" in escaped.stderr
