"""Launch job steps for a sandboxed batch script, without giving it Slurm credentials.

A batch step in gVisor cannot run ``srun`` itself: it would need the munge
socket, and a host Unix socket reached from inside gVisor is connected by a
root-run runsc process, so munge would vouch for root. Instead ``srun`` inside
the batch sandbox is slurmbox's launcher in *proxy* mode: it creates a
listening Unix socket in the step's broker directory (runsc
``--host-uds=create``: the sandbox may create sockets there, never connect to
host sockets), and this broker, part of the step supervisor, connects to it,
reads the request (argv, environment, cwd) and runs the real ``srun`` on the
node **as the job's user**, relaying its stdin, stdout and stderr over the
connection (so ``srun app > out.txt`` inside the script works), forwarding
signals and reporting its exit status back. Steps launched this way are
sandboxed like any other (``SLURMBOX_SANDBOX`` is set in the batch
environment) unless they say ``--no-sandbox`` where the partition allows it.
The host srun's argv is rebuilt from an allowlist of options
(slurmbox.sandbox.srun_allowlist): no prologs, no other job, no other cluster.
"""

import os
import shutil
import socket
import stat
import subprocess
import threading
import time

from slurmbox.sandbox.framing import EXIT_SANDBOX_FAILED, recv_frame, send_frame
from slurmbox.sandbox.peer_signals import follow_peer
from slurmbox.sandbox.srun_allowlist import RefusedOption, host_srun_environment, parse_srun_args

#: Where the broker directory appears inside the batch sandbox.
BROKER_MOUNT = "/run/slurmbox-broker"
#: How often the broker directory is scanned for new requests (seconds).
SCAN_INTERVAL = 0.02
#: How long a proxy socket may take from bind() to listen() (seconds).
CONNECT_GRACE = 2.0
#: Environment that would steer the host's srun process itself (ld.so(8), iconv(3), malloc).
DROPPED_PREFIXES = ("LD_", "MALLOC_", "GLIBC_", "SLURMBOX_", "_SLURM_SPANK_")
DROPPED_VARIABLES = ("GCONV_PATH", "HOSTALIASES", "LOCPATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS",
                     "TMPDIR", "TZDIR", "SLURM_CONF")


class StepBroker:
    """Serve ``srun`` requests from one batch sandbox.

    ``directory``: host directory bound at BROKER_MOUNT (owned by the job
    user); ``uid``/``gid``/``groups``: the job user's identity; ``stdio``:
    (stdin, stdout, stderr) descriptors of the batch step; ``fallback_cwd``:
    the batch step's working directory; ``slurm_conf``: SLURM_CONF of this
    node; ``job``: the job id srun must act on; ``partition_requires_sandbox``:
    refuse ``--no-sandbox``.
    """

    def __init__(self, directory, uid, gid, groups, stdio, fallback_cwd, slurm_conf, job,
                 partition_requires_sandbox=True):
        self.directory = directory
        self.partition_requires_sandbox = bool(partition_requires_sandbox)
        self.job = str(job)
        self.uid, self.gid, self.groups = uid, gid, list(groups)
        self.stdio = stdio
        self.fallback_cwd = fallback_cwd
        self.slurm_conf = slurm_conf
        self.srun = shutil.which("srun", path="/usr/local/bin:/usr/bin:/bin") or "/usr/bin/srun"
        self.stopped = threading.Event()
        self.seen = set()

    @classmethod
    def create(cls, step_dir, uid, gid, groups, stdio, fallback_cwd, slurm_conf, job, partition_requires_sandbox=True):
        """Make the broker directory under ``step_dir`` (mode 0700, owned by ``uid``)."""
        directory = os.path.join(step_dir, "broker")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chown(directory, uid, gid)
        return cls(directory, uid, gid, groups, stdio, fallback_cwd, slurm_conf, job, partition_requires_sandbox)

    def start(self):
        """Start scanning for requests in a daemon thread."""
        threading.Thread(target=self._scan, daemon=True).start()

    def stop(self):
        """Stop accepting new requests."""
        self.stopped.set()

    def _scan(self):
        while not self.stopped.wait(SCAN_INTERVAL):
            try:
                entries = list(os.scandir(self.directory))
            except OSError:
                return
            for entry in entries:
                if entry.name in self.seen or not entry.name.endswith(".sock"):
                    continue
                self.seen.add(entry.name)
                threading.Thread(target=self._serve, args=(entry.path,), daemon=True).start()

    def _connect(self, path):
        """Connect to the proxy's socket at ``path`` without following links.

        The directory belongs to the job's user, who could swap the name for a
        symlink to another job's socket: the socket inode is pinned with
        O_PATH|O_NOFOLLOW, checked (a socket, owned by the job's user) and
        connected through /proc/self/fd. The proxy may not be listening yet
        (bind comes before listen): retry briefly on ECONNREFUSED.
        """
        pinned = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            info = os.fstat(pinned)
            if not stat.S_ISSOCK(info.st_mode) or info.st_uid != self.uid:
                raise PermissionError("%s is not a socket of uid %d" % (path, self.uid))
            deadline = time.monotonic() + CONNECT_GRACE
            while True:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    conn.connect("/proc/self/fd/%d" % pinned)
                    return conn
                except ConnectionRefusedError:
                    conn.close()
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(SCAN_INTERVAL)
        finally:
            os.close(pinned)

    def _serve(self, path):
        conn = None
        try:
            conn = self._connect(path)
            request, fds = recv_frame(conn)
            for fd in fds:  # nothing may be passed in from the sandbox
                os.close(fd)
            if not request or not request.get("argv"):
                return
            try:
                checked = parse_srun_args(list(request["argv"])[1:], self.partition_requires_sandbox)
            except RefusedOption as refused:
                send_frame(conn, {"error": str(refused), "exit": EXIT_SANDBOX_FAILED})
                return
            status = self._run_srun(conn, request, checked)
            send_frame(conn, status)
        except (OSError, ValueError):
            pass
        finally:
            if conn is not None:
                conn.close()
            try:
                os.unlink(path)
            except OSError:
                pass

    def _environment(self, requested):
        """The real srun's environment: the sandbox's, minus what would steer srun itself.

        srun runs on the host as the job's user: loader variables (LD_*,
        GCONV_PATH, ...) would run code from the sandbox outside it, so they are
        dropped (the step does not get them either); the job id and Slurm
        configuration are this job's, whatever the sandbox says.
        """
        env = {k: v for k, v in host_srun_environment(requested).items()
               if not k.startswith(DROPPED_PREFIXES) and k not in DROPPED_VARIABLES}
        env.update({"SLURM_CONF": self.slurm_conf, "SLURM_JOB_ID": self.job, "SLURM_JOBID": self.job})
        return env

    def _run_srun(self, conn, request, checked):
        """Run ``checked`` (srun_allowlist.SrunRequest) as the job's user; returns its status frame."""
        cwd = str(request.get("cwd") or self.fallback_cwd)
        # env(1) changes directory after the switch to the job's user, so the
        # kernel checks the user's own access (Popen's cwd= would chdir as root).
        argv = ["/usr/bin/env", "--chdir=%s" % cwd] + checked.argv(self.srun)
        proc = subprocess.Popen(argv, env=self._environment(request.get("env", {})), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, user=self.uid, group=self.gid,
                                extra_groups=self.groups, start_new_session=True, close_fds=True, cwd="/")
        done = threading.Event()
        send_lock = threading.Lock()

        def on_stdin(message):
            try:
                if message.get("stdin_eof"):
                    proc.stdin.close()
                elif "stdin" in message:
                    proc.stdin.write(bytes.fromhex(message["stdin"]))
                    proc.stdin.flush()
            except (OSError, ValueError):
                pass

        def pump(stream, fd):
            for chunk in iter(lambda: stream.read1(1 << 16), b""):
                with send_lock:
                    send_frame(conn, {"fd": fd, "data": chunk.hex()})

        pumps = [threading.Thread(target=pump, args=(proc.stdout, 1), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, 2), daemon=True)]
        for thread in pumps:
            thread.start()
        follow_peer(conn, done, proc.send_signal, proc.kill, on_message=on_stdin)
        code = proc.wait()
        for thread in pumps:  # all output reaches the proxy before the exit status
            thread.join()
        done.set()
        return {"signal": -code} if code < 0 else {"exit": code}
