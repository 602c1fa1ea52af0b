"""How an evacuation of a sandboxed step ended (a checkpoint request from spot-watch,
``slurmbox migrate``, preemption or a periodic checkpoint), as one type shared by the
supervisor, the features that evacuate and the control-socket wire format."""

from enum import Enum


class Outcome(str, Enum):
    """An evacuation's outcome; a ``str`` so it travels as JSON text ("requeued", ...) and
    compares equal to the text read back from the control socket (migrate/triggers.py)."""

    #: checkpointed (or signalled) and the job requeued; it continues from the checkpoint
    REQUEUED = "requeued"
    #: checkpointed but not requeued: the sandbox runs on here (restored from that checkpoint)
    RESUMED = "resumed"
    #: the program is gone and the job could not be requeued
    LOST = "lost"
    #: a SIGTERM that was not a preemption: passed on to the program
    FORWARDED = "forwarded"
    #: a periodic checkpoint finished while the step was being evacuated otherwise
    INTERRUPTED = "interrupted"
    #: this step is not checkpointed (checkpoint mode none, or the program already ended)
    UNSUPPORTED = "unsupported"
    #: the request could not be carried out (unreachable supervisor, time-out, internal error)
    FAILED = "failed"

    def __str__(self):
        return self.value
