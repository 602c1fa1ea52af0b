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

import os
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


#: ``runsc checkpoint`` flag that saves CUDA state: before saving, gVisor runs NVIDIA's
#: ``cuda-checkpoint`` from this path *in the container's file system* on every CUDA process of the
#: sandbox (device memory moves to host memory, GPU handles are released); after ``runsc restore``
#: it toggles them back onto the GPUs the restored sandbox holds, with no restore flag (gVisor
#: g3doc/user_guide/checkpoint_restore.md "GPU Checkpoint/Restore"; runsc/cmd/checkpoint.go). The
#: 2022 and 2024 Debian builds do not have it.
CUDA_CHECKPOINT_FLAG = "cuda-checkpoint-path"
_CUDA_CHECKPOINT_LINE = re.compile(r"^\s*-{1,2}%s(?:[ \t]|$)" % re.escape(CUDA_CHECKPOINT_FLAG), re.M)
#: Where ``cuda-checkpoint`` is looked for in the sandbox's root file system when the site names no
#: path (``checkpoint_store.cuda_checkpoint``): the install locations on PATH of NVIDIA's packages and
#: of a copy of github.com/NVIDIA/cuda-checkpoint's ``bin/x86_64_Linux/cuda-checkpoint``.
CUDA_CHECKPOINT_PATHS = ("/usr/bin/cuda-checkpoint", "/usr/local/bin/cuda-checkpoint", "/usr/sbin/cuda-checkpoint")


def gpu_checkpoint_flag(checkpoint_help):
    """``CUDA_CHECKPOINT_FLAG`` when ``runsc checkpoint --help`` output (str) lists it, else None."""
    return CUDA_CHECKPOINT_FLAG if _CUDA_CHECKPOINT_LINE.search(checkpoint_help or "") else None


def find_cuda_checkpoint(root, configured=None):
    """Path *inside the sandbox* of an executable ``cuda-checkpoint``, or None.

    ``root``: the sandbox's root file system on this node (``/`` for the
    host's own root, or the ``--sandbox-image`` directory); ``configured``:
    the site's ``checkpoint_store.cuda_checkpoint`` (an absolute path inside
    the sandbox), else CUDA_CHECKPOINT_PATHS are tried in order.
    """
    for path in ([configured] if configured else CUDA_CHECKPOINT_PATHS):
        on_node = path_in_root(root or "/", path)
        if on_node and os.path.isfile(on_node) and os.access(on_node, os.X_OK):
            return path
    return None


def path_in_root(root, path, max_links=40):
    """Where ``path`` (absolute, as the sandbox sees it) is on this node when ``root`` is the
    sandbox's root directory: each symbolic link is followed inside ``root``, as it resolves in the
    sandbox (an image's ``/bin -> usr/bin``), never to the host's file of that name. Returns the
    node path (str), or None when more than ``max_links`` links are met (a loop, ELOOP)."""
    root = os.path.abspath(root)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved, links = [], 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            resolved = resolved[:-1]
            continue
        on_node = os.path.join(root, *resolved, part)
        if os.path.islink(on_node):
            links += 1
            if links > max_links:
                return None
            target = os.readlink(on_node)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        resolved.append(part)
    return os.path.join(root, *resolved)


def cuda_checkpoint_flags(checkpoint_help, cuda_checkpoint):
    """``runsc checkpoint`` flags (list) that save the CUDA state of a GPU sandbox: ``--cuda-checkpoint-path=PATH``
    with ``cuda_checkpoint`` (find_cuda_checkpoint), or [] when runsc or the binary lacks it."""
    if gpu_checkpoint_flag(checkpoint_help) and cuda_checkpoint:
        return ["--%s=%s" % (CUDA_CHECKPOINT_FLAG, cuda_checkpoint)]
    return []


def refuse_gpu_transparent(settings, device_vendors, checkpoint_help, cuda_checkpoint=True, root="/",
                           looked_for=CUDA_CHECKPOINT_PATHS):
    """Settings to use for a sandbox holding devices of ``device_vendors`` (set of "nvidia", "amd", ...).

    Transparent checkpoints cannot save accelerator state unless runsc has
    CUDA_CHECKPOINT_FLAG (NVIDIA only) and ``cuda_checkpoint`` (its path in
    the sandbox, find_cuda_checkpoint; None when it is not there; True when
    not known, as at submission) is found in the sandbox's ``root`` (where
    ``looked_for``, the paths tried, says). When the
    user asked for transparent mode, or the partition is preemptible, raises
    CheckpointOptionError saying what is missing and to use signal mode;
    otherwise (a site default on a non-preemptible partition) returns
    settings with mode "none".
    """
    if settings.mode != "transparent" or not device_vendors:
        return settings
    unsupported = sorted(v for v in device_vendors if v != "nvidia")
    if not unsupported and gpu_checkpoint_flag(checkpoint_help) and cuda_checkpoint:
        return settings
    if unsupported:
        what = "%s devices (gVisor cannot checkpoint them)" % ", ".join(unsupported)
    elif not gpu_checkpoint_flag(checkpoint_help):
        what = ("NVIDIA GPUs and this node's runsc has no CUDA checkpoint support (runsc checkpoint "
                "--%s, gVisor releases of 2025 on)" % CUDA_CHECKPOINT_FLAG)
    else:
        what = ("NVIDIA GPUs and NVIDIA's cuda-checkpoint, which runsc runs inside the sandbox to save them, is not "
                "in the sandbox's file system %s (looked for %s; install it there, or set checkpoint_store."
                "cuda_checkpoint in the site configuration)" % (root, ", ".join(looked_for)))
    if settings.explicit or settings.preemptible:
        raise CheckpointOptionError("checkpoint", "transparent",
                                    "the sandbox holds %s; use --sandbox-checkpoint=signal (your program saves "
                                    "its own state on SIGUSR1) or --sandbox-checkpoint=none" % what)
    return CheckpointSettings("none", settings.signal, 0, settings.restore_fallback, False, False)
