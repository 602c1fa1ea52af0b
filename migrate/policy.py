"""A step's checkpoint settings: the user's options over the partition's site defaults.

Options (SPANK shim, passed to the supervisor as ``checkpoint=...`` and
``checkpoint-interval=...``) win over their environment fallbacks
(``SLURMBOX_SANDBOX_CHECKPOINT``, ``SLURMBOX_SANDBOX_CHECKPOINT_INTERVAL``),
which win over the partition's ``checkpoint_mode`` / ``checkpoint_interval_s``
/ ``restore_fallback`` (site_config.compiled.PartitionPolicy; read with
getattr defaults so older compiled policies still work).

``--sandbox-checkpoint=transparent|signal[:SIG]|none``: transparent =
slurmbox saves the whole sandbox with ``runsc checkpoint``; signal = the
program gets SIG (default SIGUSR1) and saves its own state, then the job is
requeued; none = plain requeue. ``--sandbox-checkpoint-interval=MINUTES``:
periodic checkpoints (transparent mode). Standard library only.
"""

import re
import signal
from dataclasses import dataclass

MODES = ("transparent", "signal", "none")
FALLBACKS = ("fresh", "fail")
DEFAULT_SIGNAL = signal.SIGUSR1
OPTION_ENV = {"checkpoint": "SLURMBOX_SANDBOX_CHECKPOINT",
              "checkpoint-interval": "SLURMBOX_SANDBOX_CHECKPOINT_INTERVAL"}
FLAGS = {"checkpoint": "--sandbox-checkpoint", "checkpoint-interval": "--sandbox-checkpoint-interval"}


class CheckpointOptionError(ValueError):
    """A checkpoint option is invalid or cannot be honoured; ``str()`` names the option, value and fix."""

    def __init__(self, option, value, problem):
        self.option, self.value = option, value
        super().__init__("%s=%r: %s" % (FLAGS.get(option, option), value, problem))


@dataclass(frozen=True)
class CheckpointSettings:
    """``mode`` (MODES), ``signal`` (int, signal mode), ``interval_s`` (seconds, 0 = no periodic
    checkpoints), ``restore_fallback`` (FALLBACKS), ``explicit`` (the user asked for ``mode``),
    ``preemptible`` (the partition is a spot partition)."""

    mode: str = "none"
    signal: int = int(DEFAULT_SIGNAL)
    interval_s: int = 0
    restore_fallback: str = "fresh"
    explicit: bool = False
    preemptible: bool = False


def parse_signal(text):
    """``USR1``, ``SIGUSR1`` or ``10`` -> signal number. Raises ValueError."""
    text = text.strip().upper()
    if text.isdigit():
        number = int(text)
        if 0 < number < signal.NSIG:
            return number
        raise ValueError("signal number %d is out of range" % number)
    name = text if text.startswith("SIG") else "SIG" + text
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise ValueError("unknown signal %r" % text)


def _pick(name, cli_options, task_env):
    if name in cli_options and cli_options[name] not in (None, "(null)"):
        return cli_options[name]
    return task_env.get(OPTION_ENV[name])


def resolve(cli_options, task_env, partition_policy):
    """CheckpointSettings of one step.

    ``cli_options``: dict from the shim (``checkpoint``, ``checkpoint-interval``);
    ``task_env``: the task's environment (fallbacks); ``partition_policy``: the
    site's PartitionPolicy of the job's partition (or None). Raises
    CheckpointOptionError for a bad value.
    """
    mode = getattr(partition_policy, "checkpoint_mode", "transparent") or "none"
    interval_s = int(getattr(partition_policy, "checkpoint_interval_s", 0) or 0)
    fallback = getattr(partition_policy, "restore_fallback", "fresh") or "fresh"
    preemptible = bool(getattr(partition_policy, "preemptible", False))
    signum, explicit = int(DEFAULT_SIGNAL), False
    requested = _pick("checkpoint", cli_options, task_env)
    if requested is not None and requested != "":
        explicit = True
        head, _, sig = requested.partition(":")
        if head not in MODES:
            raise CheckpointOptionError("checkpoint", requested, "expected transparent, signal[:SIG] or none")
        if sig and head != "signal":
            raise CheckpointOptionError("checkpoint", requested, "only signal mode takes a signal (signal:USR2)")
        if sig:
            try:
                signum = parse_signal(sig)
            except ValueError as err:
                raise CheckpointOptionError("checkpoint", requested, str(err))
            if signum in (signal.SIGKILL, signal.SIGSTOP):
                raise CheckpointOptionError("checkpoint", requested, "SIGKILL and SIGSTOP cannot be caught")
        mode = head
    if mode not in MODES:
        mode = "none"
    minutes = _pick("checkpoint-interval", cli_options, task_env)
    if minutes not in (None, ""):
        if not re.match(r"^\d+(\.\d+)?$", str(minutes)):
            raise CheckpointOptionError("checkpoint-interval", minutes, "expected a number of minutes")
        interval_s = int(float(minutes) * 60)
    if fallback not in FALLBACKS:
        fallback = "fresh"
    return CheckpointSettings(mode, signum, interval_s, fallback, explicit, preemptible)


#: Words in ``runsc checkpoint --help`` that name GPU (CUDA) checkpoint support.
_GPU_CHECKPOINT_FLAG = re.compile(r"^\s*-{1,2}([A-Za-z0-9_-]*(?:cuda|nvproxy|gpu)[A-Za-z0-9_-]*)", re.M | re.I)


def gpu_checkpoint_flag(checkpoint_help):
    """The flag of ``runsc checkpoint --help`` output (str) that enables GPU state saving, or None.

    gVisor's 2022 build has none; releases with CUDA checkpoint support list a
    flag naming cuda/nvproxy/gpu under ``checkpoint``.
    """
    match = _GPU_CHECKPOINT_FLAG.search(checkpoint_help or "")
    return match.group(1) if match else None


def refuse_gpu_transparent(settings, device_vendors, checkpoint_help):
    """Settings to use for a sandbox holding devices of ``device_vendors`` (set of "nvidia", "amd", ...).

    Transparent checkpoints cannot save accelerator state unless runsc has a
    CUDA checkpoint flag (NVIDIA only). When the user asked for transparent
    mode, or the partition is preemptible, raises CheckpointOptionError saying
    to use signal mode; otherwise (a site default on a non-preemptible
    partition) returns settings with mode "none".
    """
    if settings.mode != "transparent" or not device_vendors:
        return settings
    unsupported = sorted(v for v in device_vendors if v != "nvidia")
    if not unsupported and gpu_checkpoint_flag(checkpoint_help):
        return settings
    what = ("%s devices (gVisor cannot checkpoint them)" % ", ".join(unsupported) if unsupported
            else "NVIDIA GPUs and this node's runsc has no CUDA checkpoint support")
    if settings.explicit or settings.preemptible:
        raise CheckpointOptionError("checkpoint", "transparent",
                                    "the sandbox holds %s; use --sandbox-checkpoint=signal (your program saves "
                                    "its own state on SIGUSR1) or --sandbox-checkpoint=none" % what)
    return CheckpointSettings("none", settings.signal, 0, settings.restore_fallback, False, False)
