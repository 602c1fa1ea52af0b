"""Fixtures: one real two-node dev cluster for the session, and job helpers.

The cluster uses the machine's real Slurm, munge and runsc (see
slurmbox.dev_cluster). Tests that need it are skipped with a reason when not
run as root or when slurmbox is not installed (scripts/install.sh).
"""

import os
import pwd
import shutil
import subprocess
import time
import uuid

import pytest

PREFIX = os.environ.get("SLURMBOX_PREFIX", "/opt/slurmbox")
TEST_USER = "sbxuser"
OTHER_USER = "sbxother"


def _cluster_skip_reason():
    if os.geteuid() != 0:
        return "needs root (starts slurmctld/slurmd and namespaces)"
    if not os.path.exists(os.path.join(PREFIX, "lib", "slurmbox_spank.so")):
        return "slurmbox is not installed; run scripts/install.sh"
    for tool in ("slurmctld", "slurmd", "runsc", "munged"):
        if not shutil.which(tool):
            return "%s is not installed; run scripts/install.sh" % tool
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        return "test user %s is missing; run scripts/install.sh" % TEST_USER
    return None


class Cluster:
    """A running dev cluster plus helpers to submit work as a given user."""

    def __init__(self, dev):
        self.dev = dev
        self.conf = dev.conf
        self.runtime_dir = dev.runtime_dir

    def env(self, **extra):
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": self.conf, "LANG": "C.UTF-8"}
        env.update(extra)
        return env

    def run(self, args, user=TEST_USER, cwd=None, env=None, timeout=120, input=None):
        """Run ``args`` (list) as ``user`` with SLURM_CONF set; returns CompletedProcess."""
        full_env = self.env(**(env or {}))
        cmd = list(args)
        if user != "root":
            # The job's environment goes to the job only; runuser itself is found with a clean PATH.
            cmd = ["/usr/sbin/runuser", "-u", user, "--", "/usr/bin/env", "-i"] + \
                ["%s=%s" % kv for kv in full_env.items()] + cmd
        return subprocess.run(cmd, cwd=cwd, env=full_env if user == "root" else self.env(), capture_output=True,
                              text=True, timeout=timeout, input=input)

    def srun(self, *args, **kwargs):
        return self.run(["srun"] + list(args), **kwargs)

    def step_dirs(self):
        """Step runtime directories and their ``<job>.<step>`` aliases (dangling ones too)
        currently present on any node (sandbox/step_dirs.py)."""
        found = []
        for node in sorted(os.listdir(self.runtime_dir)):
            node_dir = os.path.join(self.runtime_dir, node)
            for entry in sorted(os.listdir(node_dir)):
                path = os.path.join(node_dir, entry)
                if "." in entry and (os.path.isdir(path) or os.path.islink(path)):
                    found.append(path)
        return found

    def runsc_containers(self):
        """runsc state entries (containers) left in any node's runsc root."""
        leftover = []
        for node in sorted(os.listdir(self.runtime_dir)):
            root = os.path.join(self.runtime_dir, node, "runsc")
            if os.path.isdir(root):
                leftover += [os.path.join(root, e) for e in os.listdir(root)]
        return leftover

    def sandbox_processes(self, job=None):
        """Command lines of runsc/supervisor processes of this cluster (optionally one job)."""
        out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
        marker = self.runtime_dir
        hits = [line for line in out if marker in line and ("runsc" in line or "supervisor" in line)]
        if job is not None:
            hits = [line for line in hits if "slurmbox-%s." % job in line or "/%s." % job in line]
        return hits

    def wait_for(self, predicate, timeout=60.0, what="condition"):
        """Poll ``predicate`` until true (Slurm and runsc offer no event to await).

        ``what``: text, or a callable giving text, for the failure message."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what() if callable(what) else what))

    def job_state(self, job):
        out = self.run(["squeue", "-h", "-j", str(job), "-o", "%T"], user="root").stdout.strip()
        return out or "GONE"


def _free_subnet():
    """A dev-cluster subnet no other cluster or test session on this machine uses."""
    from slurmbox.dev_cluster.cluster import claim_free_subnet

    return claim_free_subnet(20, 199)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    reason = _cluster_skip_reason()
    if reason:
        pytest.skip(reason)
    from slurmbox.dev_cluster.cluster import DevCluster

    directory = "/tmp/sbxt-%s" % uuid.uuid4().hex[:6]
    dev = DevCluster(directory, nodes=2, gpus_per_node=2, subnet=_free_subnet(), prefix=PREFIX)
    dev.up()
    try:
        yield Cluster(dev)
    finally:
        dev.down()


@pytest.fixture
def workdir():
    """A fresh directory owned by the test user, removed afterwards."""
    entry = pwd.getpwnam(TEST_USER)
    path = os.path.join(entry.pw_dir, "sbxtest-%s" % uuid.uuid4().hex[:8])
    os.makedirs(path)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def user_ids():
    entry = pwd.getpwnam(TEST_USER)
    return entry.pw_uid, entry.pw_gid


@pytest.fixture(autouse=True)
def dev_null_is_left_alone():
    """Fail the test after which /dev/null changed owner or mode (and put it back).

    runsc re-owns the stdio it gives a sandbox to the sandbox's user: a test or a code path
    that hands it /dev/null (subprocess.DEVNULL, an inherited stdin) breaks /dev/null for
    every other user of the machine. Give runsc pipes."""
    before = os.stat("/dev/null")
    yield
    after = os.stat("/dev/null")
    if (after.st_uid, after.st_gid, after.st_mode) != (before.st_uid, before.st_gid, before.st_mode):
        if os.geteuid() == 0:
            os.chown("/dev/null", before.st_uid, before.st_gid)
            os.chmod("/dev/null", before.st_mode & 0o7777)
        pytest.fail("/dev/null went from uid %d mode %o to uid %d mode %o during this test: something gave runsc "
                    "/dev/null as stdio (give it pipes)" % (before.st_uid, before.st_mode & 0o777, after.st_uid,
                                                           after.st_mode & 0o777))


MEASURE_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "measure")


@pytest.fixture(scope="session")
def measure_data(tmp_path_factory):
    """A private copy of tests/data/measure (a 0700 directory): the harness refuses task files a
    sandbox could read, and a clone of this repository may sit anywhere (/work, /check, ...).

    ``@TASK_PATH@`` in the candidates is replaced by the staged matmul task's path, so that
    exploit 3 tries to read the very file the harness imports.
    """
    staged = tmp_path_factory.mktemp("measure-data")
    os.chmod(str(staged), 0o700)
    task_path = os.path.join(str(staged), "matmul_task.py")
    for name in os.listdir(MEASURE_DATA):
        if name.endswith(".py"):
            with open(os.path.join(MEASURE_DATA, name)) as source:
                text = source.read().replace("@TASK_PATH@", task_path)
            with open(os.path.join(str(staged), name), "w") as target:
                target.write(text)
    return str(staged)
