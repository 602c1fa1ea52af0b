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
