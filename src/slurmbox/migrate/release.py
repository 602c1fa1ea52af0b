"""Start a job evacuated from a drained node again without Slurm's requeue hold.

Slurm makes a requeued batch job eligible only ``cred_expire`` + 1 seconds
later (slurm.conf ``AuthInfo=cred_expire``, default 120 s; ``Reason=BeginTime``):
until then the old node refuses to launch it again ("Job credential
revoked", seen on 22.05: the job then FAILS). When the job left a node that
is now drained (spot-watch, migrate), it cannot land there, so once
slurmctld shows it PENDING its begin time is set to now (``scontrol update
JobId=J StartTime=now``). Never used for preemption, where the job may return
to the node it left; sites that want requeued spot jobs back sooner lower
``cred_expire`` (the dev cluster uses 20 s).
"""

import argparse
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
