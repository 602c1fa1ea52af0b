"""What asks for a checkpoint: Slurm preemption, or a root-run tool over a step's control socket.

- **Preemption.** With ``PreemptMode=REQUEUE`` and ``GraceTime``, slurmctld
  sends the job SIGTERM (or its ``--signal``) and records the preemption time
  in the job (``scontrol show job``: ``PreemptTime=``, ``None`` until then;
  scontrol(1)). A SIGTERM from ``scancel`` leaves ``PreemptTime=None``, so the
  supervisor asks slurmctld which one it got.
- **Control socket.** Each step supervisor listens on ``control.sock`` in its
  step runtime directory (root only, peer uid checked). ``slurmbox
  spot-watch`` and ``slurmbox migrate`` send ``{"action": "checkpoint",
  "reason": R}`` and get ``{"outcome": O, "message": M, "checkpoint": PATH}``
  back, O being "requeued" (checkpointed or signalled, job requeued),
  "unsupported" (this step is not checkpointed) or "failed". Frames as in
  slurmbox.sandbox.launcher (4-byte length + JSON).
"""

import os
import socket

from slurmbox.sandbox.launcher import recv_frame, send_frame
from slurmbox.slurm_client import scontrol

CONTROL_SOCKET = "control.sock"


def preempted(job, env=None):
    """True when slurmctld records a preemption of ``job`` (``PreemptTime`` set).

    Raises scontrol.SlurmCommandError when slurmctld cannot be asked.
    """
    record = scontrol.show_job(job, env=env)
    value = record.get("PreemptTime", "None")
    return value not in ("", "None", "Unknown", "(null)")


def request_checkpoint(step_dir, reason, timeout=120.0):
    """Ask the supervisor of ``step_dir`` to checkpoint (or signal) its sandbox and requeue the job.

    Returns the supervisor's answer (dict with ``outcome`` and ``message``);
    ``{"outcome": "failed", ...}`` when it cannot be reached.
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
        return {"outcome": "failed", "message": "cannot reach the supervisor at %s: %s" % (path, err)}
    finally:
        conn.close()
    if not isinstance(answer, dict):
        return {"outcome": "failed", "message": "the supervisor at %s closed the connection" % path}
    return answer
