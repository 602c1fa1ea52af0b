"""What asks for a checkpoint: Slurm preemption, or a root-run tool over a step's control socket.

- **Preemption.** With ``PreemptMode=REQUEUE`` and ``GraceTime``, slurmctld
  records the preemption time in the job (``scontrol show job``:
  ``PreemptTime=``, ``None`` until then; scontrol(1)) and sets its end time to
  now + GraceTime. Per slurm.conf(5) (GraceTime), the job's *tasks* get
  SIGCONT+SIGTERM at once, the *batch script* only when the grace time ends,
  followed by SIGKILL KillWait seconds later; seen so on Slurm 22.05. A
  sandboxed batch script therefore keeps computing through the grace time and
  is checkpointed on that final SIGTERM, within KillWait. A SIGTERM from
  ``scancel`` leaves ``PreemptTime=None``, so the supervisor asks slurmctld
  which one it got. Because the batch script gets no signal when the grace
  time starts, the supervisor of a checkpointable batch step also polls
  ``PreemptTime`` (every watch_interval(GraceTime) seconds, only on
  partitions with ``PreemptMode=REQUEUE`` and a GraceTime) and checkpoints as
  soon as it is set, early in the grace time.
- **Control socket.** Each step supervisor listens on ``control.sock`` in its
  step runtime directory (root only, peer uid checked). ``slurmbox
  spot-watch`` and ``slurmbox migrate`` send ``{"action": "checkpoint",
  "reason": R}`` and get ``{"outcome": O, "message": M, "checkpoint": PATH}``
  back, O being "requeued" (checkpointed or signalled, job requeued),
  "unsupported" (this step is not checkpointed) or "failed". Frames as in
  slurmbox.sandbox.framing (4-byte length + JSON).
"""

import os
import socket

from slurmbox.sandbox.framing import recv_frame, send_frame
from slurmbox.slurm_client import scontrol
from slurmbox.migrate.outcomes import Outcome

CONTROL_SOCKET = "control.sock"


def preempted(job, env=None):
    """True when slurmctld records a preemption of ``job`` (``PreemptTime`` set).

    Raises scontrol.SlurmCommandError when slurmctld cannot be asked.
    """
    record = scontrol.show_job(job, env=env)
    value = record.get("PreemptTime", "None")
    return value not in ("", "None", "Unknown", "(null)")


def partition_grace(partition, env=None):
    """(GraceTime in seconds, PreemptMode) of ``partition`` from ``scontrol show partition``.

    Raises scontrol.SlurmCommandError when slurmctld cannot be asked.
    """
    record = scontrol.show_partition(partition, env=env)
    text = record.get("GraceTime", "0")
    seconds = 0
    for part in text.replace("-", ":").split(":"):
        seconds = seconds * 60 + int(part) if part.isdigit() else seconds
    return seconds, record.get("PreemptMode", "OFF")


def watch_interval(grace_s):
    """Seconds between preemption polls for a partition with ``grace_s`` of GraceTime: a quarter of it,
    between 1 and 30 s, so a checkpoint starts early in the grace time."""
    return min(30.0, max(1.0, grace_s / 4.0))


def request_checkpoint(step_dir, reason, timeout=120.0):
    """Ask the supervisor of ``step_dir`` to checkpoint (or signal) its sandbox and requeue the job.

    Returns the supervisor's answer (dict with ``outcome`` and ``message``);
    ``{"outcome": Outcome.FAILED, ...}`` when it cannot be reached.
    """
    path = os.path.join(step_dir, CONTROL_SOCKET)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(path)
        send_frame(conn, {"action": "checkpoint", "reason": reason})
        answer, fds = recv_frame(conn)
        for fd in fds:
            os.close(fd)
    except (OSError, ValueError) as err:
        return {"outcome": Outcome.FAILED, "message": "cannot reach the supervisor at %s: %s" % (path, err)}
    finally:
        conn.close()
    if not isinstance(answer, dict):
        return {"outcome": Outcome.FAILED, "message": "the supervisor at %s closed the connection" % path}
    return answer
