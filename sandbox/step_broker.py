"""Launch job steps for a sandboxed batch script, without giving it Slurm credentials.

A batch step in gVisor cannot run ``srun`` itself: it would need the munge
socket, and a host Unix socket reached from inside gVisor is connected by a
root-run runsc process, so munge would vouch for root. Instead ``srun`` inside
the batch sandbox is slurmbox's launcher in *proxy* mode: it creates a
listening Unix socket in the step's broker directory (runsc
``--host-uds=create``: the sandbox may create sockets there, never connect to
host sockets), and this broker, part of the step supervisor, connects to it,
reads the request (argv, environment, cwd) and runs the real ``srun`` on the
node **as the job's user**, with the batch step's stdout/stderr, forwarding
signals and reporting its exit status back. Steps launched this way are
sandboxed like any other (``SLURMBOX_SANDBOX`` is set in the batch
environment) unless they say ``--no-sandbox`` where the partition allows it.
"""

import os
import shutil
import socket
import stat
import subprocess
import threading

from slurmbox.sandbox.bundle import path_reachable
from slurmbox.sandbox.launcher import recv_frame, send_frame
from slurmbox.sandbox.peer_signals import follow_peer

#: Where the broker directory appears inside the batch sandbox.
BROKER_MOUNT = "/run/slurmbox-broker"
#: How often the broker directory is scanned for new requests (seconds).
SCAN_INTERVAL = 0.02


class StepBroker:
    """Serve ``srun`` requests from one batch sandbox.

    ``directory``: host directory bound at BROKER_MOUNT (owned by the job
    user); ``uid``/``gid``/``groups``: the job user's identity; ``stdio``:
    (stdin, stdout, stderr) descriptors of the batch step; ``fallback_cwd``:
    host directory used when the requested cwd is not reachable;
    ``slurm_conf``: SLURM_CONF of this node.
    """

    def __init__(self, directory, uid, gid, groups, stdio, fallback_cwd, slurm_conf):
        self.directory = directory
        self.uid, self.gid, self.groups = uid, gid, list(groups)
        self.stdio = stdio
        self.fallback_cwd = fallback_cwd
        self.slurm_conf = slurm_conf
        self.srun = shutil.which("srun", path="/usr/local/bin:/usr/bin:/bin") or "/usr/bin/srun"
        self.stopped = threading.Event()
        self.seen = set()

    @classmethod
    def create(cls, step_dir, uid, gid, groups, stdio, fallback_cwd, slurm_conf):
        """Make the broker directory under ``step_dir`` (mode 0700, owned by ``uid``)."""
        directory = os.path.join(step_dir, "broker")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chown(directory, uid, gid)
        return cls(directory, uid, gid, groups, stdio, fallback_cwd, slurm_conf)

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
                try:
                    info = os.lstat(entry.path)
                except OSError:
                    continue
                if stat.S_ISSOCK(info.st_mode) and info.st_uid == self.uid:
                    threading.Thread(target=self._serve, args=(entry.path,), daemon=True).start()

    def _serve(self, path):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)  # the proxy renames its socket to *.sock only once it listens
            request, fds = recv_frame(conn)
            for fd in fds:  # nothing may be passed in from the sandbox
                os.close(fd)
            if not request or not request.get("argv"):
                return
            status = self._run_srun(conn, request)
            send_frame(conn, status)
        except (OSError, ValueError):
            pass
        finally:
            conn.close()
            try:
                os.unlink(path)
            except OSError:
                pass

    def _environment(self, requested):
        env = {k: str(v) for k, v in dict(requested).items() if not k.startswith("SLURMBOX_STEP_BROKER")}
        env["SLURM_CONF"] = self.slurm_conf
        return env

    def _run_srun(self, conn, request):
        cwd = request.get("cwd") or self.fallback_cwd
        if not (os.path.isdir(cwd) and path_reachable(cwd, self.uid, [self.gid] + self.groups)):
            cwd = self.fallback_cwd
        proc = subprocess.Popen([self.srun] + [str(a) for a in request["argv"][1:]], env=self._environment(
            request.get("env", {})), cwd=cwd, stdin=subprocess.DEVNULL, stdout=self.stdio[1],
            stderr=self.stdio[2], user=self.uid, group=self.gid, extra_groups=self.groups,
            start_new_session=True, close_fds=True)
        done = threading.Event()
        follow_peer(conn, done, proc.send_signal, proc.kill)
        code = proc.wait()
        done.set()
        return {"signal": -code} if code < 0 else {"exit": code}
