"""Slurm mode: each candidate runs as its own sandboxed Slurm step (``srun --sandbox``).

The harness runs as the job's user inside an allocation (a batch script or
``salloc``), outside any sandbox, and starts for every candidate::

    srun --sandbox --sandbox-network=none -N1 -n1 -u --chdir=STAGE/code \\
         --sandbox-mounts=STAGE/code:/candidate:ro,PYTHON_PREFIX:PYTHON_PREFIX:ro \\
         --sandbox-workdir=/tmp PYTHON -I /candidate/runner.py --stdio /candidate/candidate.py

slurmbox's SPANK plugin puts the step in a gVisor sandbox (see the README's
security model). The channel is the step's stdin/stdout, relayed by srun;
the runner moves it off fd 0/1 before importing the candidate, so the
candidate's prints go to stderr and never into the channel. ``--chdir``
makes the stage directory the step's working directory, which slurmbox binds
into the sandbox; the harness's own directory (task file, records) is
never bound. Everything else
is the local mode's harness: secret inputs, the separate reference process,
checks outside, the harness's clock around each request/response.

What this mode does not have, and says so in the record (``cpu_ns`` -1):
the kernel CPU-time cross-check (the harness is not root and runsc's
cgroup is not known to it) and slurmbox's own cpuset pinning; ask Slurm
for the CPUs instead (``--exclusive``, ``--cpu-bind``, task/affinity or
task/cgroup on the cluster). srun's stdio relay costs tens of ms per
sample here and varies, so small kernels are dominated by it and a claim
below the harness's window is not judged (one above it still is). The stage directory (candidate, runner) is
created under the current directory, readable by the job's user only.
"""

import os
import shutil
import subprocess
import sys
import tempfile

from slurmbox.measure import candidate_sandbox as cs
from slurmbox.measure import protocol


class SlurmStepCandidate(cs._Candidate):
    """A candidate in a sandboxed Slurm step. ``srun_args``: extra srun options (list of str).

    Raises candidate_sandbox.SandboxStartError when srun is missing or the step does not come up.
    """

    def __init__(self, candidate_path, label, srun_args=(), start_timeout=120.0):
        super().__init__(candidate_path, label, os.getuid(), os.getgid(), start_timeout)
        self.srun_args = list(srun_args)
        self.cgroups_path = None
        self.workdir = tempfile.mkdtemp(prefix=".slurmbox-measure-", dir=os.getcwd())
        self.code_dir = os.path.join(self.workdir, "code")
        self.channel_dir = os.path.join(self.workdir, "channel")
        self.config = {}

    def _stage(self):
        os.chmod(self.workdir, 0o700)
        os.makedirs(self.code_dir, mode=0o755)
        here = os.path.dirname(os.path.abspath(__file__))
        for name in cs.RUNNER_FILES:
            shutil.copyfile(os.path.join(here, name), os.path.join(self.code_dir, name))
        shutil.copyfile(self.candidate_path, os.path.join(self.code_dir, "candidate.py"))

    def command(self):
        """The srun command line (list) of this candidate's step."""
        srun = shutil.which("srun")
        if not srun:
            raise cs.SandboxStartError("srun is not on PATH; Slurm mode runs inside a Slurm allocation")
        mounts = ["%s:/candidate:ro" % self.code_dir]
        for prefix in sorted({sys.prefix, sys.base_prefix}):
            if prefix not in ("/usr", "/"):
                mounts.append("%s:%s:ro" % (os.path.realpath(prefix), prefix))
        # --chdir: slurmbox binds the step's working directory into the sandbox read-write; it must
        # be this stage directory, never the harness's own (task file, records).
        return [srun, "--sandbox", "--sandbox-network=none", "-N1", "-n1", "-u", "--chdir=" + self.code_dir,
                "--sandbox-mounts=" + ",".join(mounts), "--sandbox-workdir=/tmp", *self.srun_args,
                sys.executable, "-I", "/candidate/runner.py", "--stdio", "/candidate/candidate.py"]

    def start(self):
        """Stage the files, start the srun step and read the runner's hello. Raises SandboxStartError."""
        try:
            self._stage()
            argv = self.command()
            self.config = {"runtime": "slurm step (srun --sandbox)", "srun": argv[:-5], "uid": self.uid,
                           "cpu_accounting": "unavailable in Slurm mode",
                           "job": os.environ.get("SLURM_JOB_ID", "")}
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, close_fds=True)
            self.drains = [cs._Drain(self.proc.stderr)]
            self.drains[0].start()
            self.conn = protocol.PipeChannel(self.proc.stdout.fileno(), self.proc.stdin.fileno())
            self.conn.settimeout(self.start_timeout)
            try:
                hello = protocol.recv_header(self.conn)
            except (protocol.ProtocolError, OSError) as err:
                raise cs.SandboxStartError("the candidate's step did not greet the harness (%s):\n%s"
                                           % (err, self.stderr_text()))
            if hello["op"] != "hello":
                raise cs.SandboxStartError("the candidate failed to load:\n%s" % str(hello.get("error", ""))[-2000:])
        except BaseException:
            self.stop()
            raise

    def stdout_text(self):
        return ""

    def stderr_text(self):
        return self.drains[0].text() if self.drains else ""

    def logs(self):
        return "--- stderr ---\n" + self.stderr_text()

    def channel_leftovers(self):
        return []

    def _stop(self):
        """Close the channel (the step ends), wait for srun, remove the stage directory."""
        if self.conn is not None:
            try:
                self.conn.settimeout(2)
                protocol.send(self.conn, {"op": "exit"})
            except OSError:
                pass
            self.conn = None
        if self.proc is not None:
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self._wait_drains()
        shutil.rmtree(self.workdir, ignore_errors=True)
