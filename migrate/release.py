"""Start a requeued, checkpointed job again without Slurm's requeue hold.

Slurm (seen on 22.05) makes a requeued batch job eligible only about two
minutes later (``Reason=BeginTime``). A job slurmbox checkpointed has its
state safe in the store, so once slurmctld shows it PENDING again its begin
time is set to now (``scontrol update JobId=J StartTime=now``). Run detached
by the step supervisor (``python -I -m slurmbox.migrate.release JOB
--slurm-conf PATH``), or called by spot-watch and migrate.
"""

import argparse
import os
import sys
import time

from slurmbox.slurm_client import scontrol

#: Seconds to wait for the job to be pending again.
WAIT_S = 120.0


def release_when_pending(job, env=None, timeout=WAIT_S, poll=0.5):
    """Wait until ``job`` is PENDING, then lift its begin-time hold. Returns True when done.

    Polls ``scontrol show job`` (slurmctld offers no event for this).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = scontrol.show_job(job, env=env).get("JobState", "")
            if state == "PENDING":
                scontrol.release_begin_time(job, env=env)
                return True
            if state not in ("RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PREEMPTED",
                             "CONFIGURING", "STAGE_OUT", "RESIZING"):
                return False
        except scontrol.SlurmCommandError:
            pass
        time.sleep(poll)
    return False


def spawn_detached(job, slurm_conf):
    """Run release_when_pending for ``job`` in a detached process (double fork; survives the step's cleanup)."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):
            os.dup2(devnull, fd)
        os.execv(sys.executable, [sys.executable, "-I", "-m", "slurmbox.migrate.release", str(job),
                                  "--slurm-conf", slurm_conf or ""])
    finally:
        os._exit(127)


def main(argv=None):
    """``python -m slurmbox.migrate.release JOB [--slurm-conf PATH]``."""
    parser = argparse.ArgumentParser(prog="slurmbox-release")
    parser.add_argument("job")
    parser.add_argument("--slurm-conf", default="")
    args = parser.parse_args(argv)
    env = scontrol.slurm_env(args.slurm_conf or None)
    sys.exit(0 if release_when_pending(args.job, env=env) else 1)


if __name__ == "__main__":
    main()
