"""Start one candidate inside its own runsc sandbox and connect to it.

The OCI bundle (built with slurmbox.sandbox.bundle) has: the host root
read-only with private host areas masked, a private /tmp, no network
(runsc ``--network=none`` in a new network namespace), its own pid/ipc/uts
namespaces, the candidate running as an unprivileged uid (default nobody)
with no capabilities and no_new_privs, and exactly these binds:

- ``/mnt`` (``SANDBOX_MOUNT``) holding ``code/`` (root's, read-only to the
  candidate: the candidate file, runner.py and protocol.py) and ``channel/``
  (owned by the candidate uid): where the runner creates the result socket
  (runsc ``--host-uds=create``: the sandbox may create host sockets but never
  connect to one);
- the Python environment the runner needs (read-only), when it is outside
  the host root's visible part.

Task files, seeds, inputs not yet sent, expected outputs and the harness's
records are never mounted. ``linux.cgroupsPath`` and ``resources.cpu.cpus``
put the sandbox in its own cgroup on the sandbox CPUs (isolation.py).

``BareCandidate`` runs the same runner without a sandbox; it exists only as
the baseline of benchmarks/measure_fidelity.py and must not be given
untrusted code.
"""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

from slurmbox.measure import isolation, protocol
from slurmbox.sandbox import runsc

RUNTIME_DIR = "/run/slurmbox-measure"
RUNNER_FILES = ("runner.py", "protocol.py")
LOG_LIMIT = 64 * 1024
NOBODY = 65534
#: Where the candidate's files and channel appear inside its sandbox. An existing directory of
#: every node's root (FHS): runsc's gofer creates a missing bind destination on the host as root,
#: so slurmbox binds only at paths that exist (sandbox.bundle.mount_point_problem).
SANDBOX_MOUNT = "/mnt"
#: Memory limit of a candidate's sandbox (MB, 0 = none): a candidate must not be able to exhaust the node.
MEMORY_LIMIT_MB = 4096


class _TeardownGuard:
    """Holds SIGTERM back while a teardown runs (it is delivered, and may end the harness,
    right after), so a termination can never leave half a sandbox behind."""

    def __enter__(self):
        import signal
        self.previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def __exit__(self, *exc):
        import signal
        signal.pthread_sigmask(signal.SIG_SETMASK, self.previous)


class SandboxStartError(RuntimeError):
    """The candidate's sandbox (or process) did not come up; the message says why and shows its log."""


class _Drain(threading.Thread):
    """Reads a pipe to its end, keeping the first LOG_LIMIT bytes (the rest is counted, not kept)."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.data = bytearray()
        self.dropped = 0

    def run(self):
        while True:
            chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
            if not chunk:
                break
            room = LOG_LIMIT - len(self.data)
            self.data += chunk[:max(room, 0)]
            self.dropped += max(len(chunk) - max(room, 0), 0)
        self.stream.close()

    def text(self):
        suffix = "\n[... %d more bytes not kept]" % self.dropped if self.dropped else ""
        return self.data.decode("utf-8", "replace") + suffix


def _python_mounts():
    """Read-only binds that make sys.executable (with numpy) usable inside the sandbox:
    its prefix and base prefix where the masked host view would hide them."""
    from slurmbox.sandbox import bundle, options
    mounts = {}
    for prefix in (sys.prefix, sys.base_prefix):
        if any(prefix == d or prefix.startswith(d + "/") for d in bundle.MASKED_HOST_DIRS):
            mounts[prefix] = options.Mount(source=os.path.realpath(prefix), destination=prefix, read_only=True)
    return [mounts[k] for k in sorted(mounts)]


class _Candidate:
    """Common part: staging directory, log drains, the channel connection."""

    def __init__(self, candidate_path, label, uid=NOBODY, gid=NOBODY, start_timeout=60.0):
        self.candidate_path = os.path.abspath(candidate_path)
        if not os.path.isfile(self.candidate_path):
            raise SandboxStartError("candidate file %s does not exist" % self.candidate_path)
        self.label = label
        self.uid, self.gid = uid, gid
        self.start_timeout = start_timeout
        self.id = "measure-%s-%s" % ("".join(c if c.isalnum() else "-" for c in label)[:40], uuid.uuid4().hex[:10])
        self.workdir = os.path.join(RUNTIME_DIR, self.id)
        self.shared_dir = os.path.join(self.workdir, "shared")  # bound at SANDBOX_MOUNT
        self.code_dir = os.path.join(self.shared_dir, "code")
        self.channel_dir = os.path.join(self.shared_dir, "channel")
        self.proc = None
        self.conn = None
        self.drains = []
        self.stopped = False
        self.cgroups_path = "/%s/%s" % (isolation.PARENT, self.id)

    def _stage(self):
        os.makedirs(RUNTIME_DIR, mode=0o700, exist_ok=True)
        os.chmod(RUNTIME_DIR, 0o711)
        os.makedirs(self.workdir, mode=0o711)
        os.makedirs(self.shared_dir, mode=0o755)
        os.makedirs(self.code_dir, mode=0o755)
        here = os.path.dirname(os.path.abspath(__file__))
        for name in RUNNER_FILES:
            shutil.copyfile(os.path.join(here, name), os.path.join(self.code_dir, name))
        shutil.copyfile(self.candidate_path, os.path.join(self.code_dir, "candidate.py"))
        for name in os.listdir(self.code_dir):
            os.chmod(os.path.join(self.code_dir, name), 0o644)
        os.makedirs(self.channel_dir, mode=0o700)
        os.chown(self.channel_dir, self.uid, self.gid)

    def _spawn(self, argv, preexec_fn=None, through=subprocess.Popen):
        """Start ``argv`` through ``through`` (sandbox.runsc.spawn for runsc) with pipes as stdio."""
        self.proc = through(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=preexec_fn, close_fds=True, start_new_session=True)
        self.proc.stdin.close()
        self.drains = [_Drain(self.proc.stdout), _Drain(self.proc.stderr)]
        for drain in self.drains:
            drain.start()

    def _connect(self, socket_path):
        deadline = time.monotonic() + self.start_timeout
        while True:
            if os.path.lexists(socket_path):
                conn = self._connect_socket(socket_path)
                if conn is not None:
                    break
            if self.proc.poll() is not None:
                raise SandboxStartError("the candidate exited (status %s) before opening its channel:\n%s"
                                        % (self.proc.returncode, self.logs()))
            if time.monotonic() > deadline:
                raise SandboxStartError("the candidate did not open its channel within %.0f s:\n%s"
                                        % (self.start_timeout, self.logs()))
            time.sleep(0.005)
        conn.settimeout(self.start_timeout)
        try:
            hello = protocol.recv_header(conn)
            protocol.recv_arrays(conn, hello, 0)
        except (protocol.ProtocolError, OSError) as err:
            raise SandboxStartError("the candidate did not greet the harness (%s):\n%s" % (err, self.logs()))
        if hello["op"] == "error":
            raise SandboxStartError("the candidate failed to load:\n%s" % str(hello.get("error", ""))[-2000:])
        if hello["op"] != "hello":
            raise SandboxStartError("the candidate opened with %r instead of hello" % hello["op"])
        self.conn = conn

    def _connect_socket(self, socket_path):
        """Connect to the socket the runner created, never to anything else it might have put there.

        The candidate controls /channel: a symlink named ``sock`` could point the root-run
        harness at a host socket. So the path is opened with O_PATH|O_NOFOLLOW, checked to
        be a socket owned by the candidate's uid, and connected through /proc/self/fd/N
        (the same inode, no second lookup). Returns the socket, or None to retry.
        Raises SandboxStartError when the entry is something else.
        """
        import stat
        try:
            fd = os.open(socket_path, os.O_PATH | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISSOCK(info.st_mode) or info.st_uid != self.uid:
                raise SandboxStartError("the candidate put a %s owned by uid %d where its channel socket belongs; "
                                        "refusing to connect" % ("symlink" if stat.S_ISLNK(info.st_mode)
                                                                 else "non-socket", info.st_uid))
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect("/proc/self/fd/%d" % fd)
            except OSError:
                conn.close()
                return None
            return conn
        finally:
            os.close(fd)

    def logs(self):
        """The candidate's stdout and stderr so far (first 64 KiB of each), as one string."""
        out = self.drains[0].text() if self.drains else ""
        err = self.drains[1].text() if len(self.drains) > 1 else ""
        return "--- stdout ---\n%s\n--- stderr ---\n%s" % (out, err)

    def stdout_text(self):
        return self.drains[0].text() if self.drains else ""

    def stderr_text(self):
        return self.drains[1].text() if len(self.drains) > 1 else ""

    def channel_leftovers(self):
        """Entries in the channel directory other than the socket (the candidate wrote them)."""
        try:
            return sorted(set(os.listdir(self.channel_dir)) - {"sock"})
        except OSError:
            return []

    def _close_channel(self):
        if self.conn is not None:
            try:
                self.conn.settimeout(2)
                protocol.send(self.conn, {"op": "exit"})
            except OSError:
                pass
            self.conn.close()
            self.conn = None

    def _wait_drains(self):
        for drain in self.drains:
            drain.join(timeout=5)

    def stop(self):
        """Tear the candidate down (its kind's ``_stop``) with SIGTERM held back, so never halfway.
        A second call does nothing."""
        with _TeardownGuard():
            if not self.stopped:
                self._stop()
                self.stopped = True

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


class SandboxedCandidate(_Candidate):
    """A candidate in a runsc sandbox (see module doc).

    ``cpus``: set of CPUs for the sandbox (None: no cpuset restriction, only
    accounting). ``memory_limit_mb``: cgroup memory limit of the whole sandbox
    (MB; 0 = none); over it the sandbox is killed and the candidate fails. ``priority``: with ``cpus``, the maximum CPU weight (a
    measured candidate); False for other sandboxes such as a benchmark's
    neighbour. ``platform``: runsc platform or "auto". Use as a context
    manager or call start()/stop(); stop() always kills and deletes the
    container and removes its directory. Raises SandboxStartError.
    """

    def __init__(self, candidate_path, label, cpus=None, platform="auto", uid=NOBODY, gid=NOBODY,
                 start_timeout=60.0, extra_runsc_flags=(), gpus=(), priority=True, memory_limit_mb=MEMORY_LIMIT_MB):
        super().__init__(candidate_path, label, uid, gid, start_timeout)
        self.memory_limit_mb = memory_limit_mb
        self.gpus = list(gpus)
        self.device_plan = None
        self.cpus = set(cpus) if cpus else None
        self.priority = priority and bool(self.cpus)
        if not self.priority:
            self.cgroups_path = "/%s/%s" % (isolation.PARENT_SHARED, self.id)
        self.platform_request = platform
        self.extra_runsc_flags = tuple(extra_runsc_flags)
        self.state_root = os.path.join(RUNTIME_DIR, "runsc")
        self.runsc_prefix = None
        self.spec = None
        self.config = {}

    def build_spec(self):
        """The OCI config.json dict of this candidate's sandbox."""
        from slurmbox.sandbox import bundle, options
        # One read-write bind: code/ is root's (0755, files 0644), channel/ the candidate's.
        mounts = [options.Mount(source=self.shared_dir, destination=SANDBOX_MOUNT, read_only=False)]
        mounts += _python_mounts()
        request = SimpleNamespace(image=None, network="none", mounts=mounts)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        plan = self.device_plan
        if plan is not None and plan.devices:
            env.update(plan.env)
            env["SLURMBOX_MEASURE_GPU"] = "1"
        process = bundle.process_spec(
            [sys.executable, "-I", SANDBOX_MOUNT + "/code/runner.py", SANDBOX_MOUNT + "/code/candidate.py",
             SANDBOX_MOUNT + "/channel/sock"], env,
            "/tmp", self.uid, self.gid, [], False,
            [{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 1024}, {"type": "RLIMIT_CORE", "soft": 0, "hard": 0}])
        spec = bundle.build_spec(process, request, "candidate", [], plan.devices if plan is not None else [])
        spec["linux"]["cgroupsPath"] = self.cgroups_path
        if self.memory_limit_mb:  # the whole sandbox (gVisor's kernel, the candidate and its tmpfs files)
            spec["linux"]["resources"]["memory"] = {"limit": self.memory_limit_mb * 1024 * 1024}
        if self.cpus:
            with open("/sys/fs/cgroup/cpuset/cpuset.mems" if isolation.cgroup_version() == 1
                      else "/sys/fs/cgroup/cpuset.mems.effective") as handle:
                mems = handle.read().strip() or "0"
            spec["linux"]["resources"]["cpu"] = {"cpus": isolation.format_cpu_list(self.cpus), "mems": mems}
            if self.priority:
                spec["linux"]["resources"]["cpu"]["shares"] = isolation.MAX_SHARES_V1
        return spec

    def start(self):
        """Stage the files, write the bundle, ``runsc run`` the sandbox, connect and read its hello.

        Raises SandboxStartError (everything started so far is torn down first).
        """
        import json

        try:
            runsc_path = runsc.find_runsc()
            caps = runsc.capabilities(runsc_path, RUNTIME_DIR)
            platform = runsc.choose_platform(self.platform_request, caps)
            from slurmbox.sandbox import devices
            self.device_plan = devices.plan_devices(self.gpus, set(caps.get("flags", ())))
        except (runsc.RunscError, OSError) as err:
            raise SandboxStartError(str(err))
        except Exception as err:  # devices.DeviceError: the message says what to do
            raise SandboxStartError(str(err))
        isolation.prepare_parent(self.cgroups_path.split("/")[1])
        try:
            self._stage()
            bundle_dir = os.path.join(self.workdir, "bundle")
            os.makedirs(bundle_dir, mode=0o700)
            self.spec = self.build_spec()
            with open(os.path.join(bundle_dir, "config.json"), "w") as handle:
                json.dump(self.spec, handle, indent=1)
            os.makedirs(self.state_root, mode=0o700, exist_ok=True)
            self.runsc_prefix = runsc.global_args(runsc_path, self.state_root, platform, "none",
                                                  ["--host-uds=create", *self.device_plan.runsc_flags,
                                                   *self.extra_runsc_flags])
            self.config = {"runtime": "runsc", "runsc_version": caps.get("version", "?"), "platform": platform,
                           "network": "none", "host_uds": "create", "uid": self.uid, "gid": self.gid,
                           "root_readonly": True, "cgroups_path": self.cgroups_path,
                           "cpus": isolation.format_cpu_list(self.cpus) if self.cpus else "",
                           "gpus": list(self.gpus), "runsc_flags": list(self.runsc_prefix[1:]),
                           "mounts": [m["destination"] + ":" + ",".join(m.get("options", [])) for m in
                                      self.spec["mounts"] if m["type"] == "bind"]}
            self._spawn(self.runsc_prefix + ["run", "--bundle", bundle_dir, self.id], through=runsc.spawn)
            self._connect(os.path.join(self.channel_dir, "sock"))
        except BaseException:
            self.stop()
            raise

    def _stop(self):
        """Close the channel, end the container (runsc kill/delete), remove the staging directory."""
        self._close_channel()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.runsc_prefix is not None:
            runsc.kill(self.runsc_prefix, self.id, "KILL")
            runsc.delete(self.runsc_prefix, self.id)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._wait_drains()
        isolation.remove_cgroup(self.cgroups_path)
        shutil.rmtree(self.workdir, ignore_errors=True)


class BareCandidate(_Candidate):
    """The runner WITHOUT a sandbox (benchmark baseline only; never for untrusted code).

    Runs as ``uid`` in its own cgroup restricted to ``cpus`` so the same CPU
    accounting applies.
    """

    def __init__(self, candidate_path, label, cpus=None, uid=NOBODY, gid=NOBODY, start_timeout=60.0):
        super().__init__(candidate_path, label, uid, gid, start_timeout)
        self.cpus = set(cpus) if cpus else None
        if not self.cpus:
            self.cgroups_path = "/%s/%s" % (isolation.PARENT_SHARED, self.id)
        self.config = {"runtime": "bare (no sandbox)", "uid": uid, "cgroups_path": self.cgroups_path,
                       "cpus": isolation.format_cpu_list(self.cpus) if self.cpus else ""}

    def start(self):
        """Start the runner as ``uid`` in its own cgroup and connect. Raises SandboxStartError."""
        try:
            self._stage()
            isolation.create_cgroup(self.cgroups_path, self.cpus or isolation.online_cpus())
            cgroups_path, uid, gid = self.cgroups_path, self.uid, self.gid

            def enter():
                isolation.attach(cgroups_path, os.getpid())
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
            env_python = sys.executable
            self._spawn([env_python, "-I", os.path.join(self.code_dir, "runner.py"),
                         os.path.join(self.code_dir, "candidate.py"), os.path.join(self.channel_dir, "sock")],
                        preexec_fn=enter)
            self._connect(os.path.join(self.channel_dir, "sock"))
        except BaseException:
            self.stop()
            raise

    def _stop(self):
        """Close the channel, kill everything left in the cgroup, remove cgroup and staging directory."""
        self._close_channel()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        isolation.kill_all(self.cgroups_path)
        self._wait_drains()
        isolation.remove_cgroup(self.cgroups_path)
        shutil.rmtree(self.workdir, ignore_errors=True)
