"""A step's checkpoint settings: the user's options over the partition's site defaults.

Options (SPANK shim, passed to the supervisor as ``checkpoint=...`` and
``checkpoint-interval=...``) win over their environment fallbacks
(``SLURMBOX_SANDBOX_CHECKPOINT``, ``SLURMBOX_SANDBOX_CHECKPOINT_INTERVAL``),
which win over the partition's ``checkpoint_mode`` / ``checkpoint_interval_s``
/ ``restore_fallback`` (settings.compiled.PartitionPolicy; read with
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
import stat
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
#: it toggles them back, with no restore flag (gVisor g3doc/user_guide/checkpoint_restore.md "GPU
#: Checkpoint/Restore"; runsc/cmd/checkpoint.go). The Debian 2022 and 2024 builds do not have it.
CUDA_CHECKPOINT_FLAG = "cuda-checkpoint-path"
_CUDA_CHECKPOINT_LINE = re.compile(r"^\s*-{1,2}%s(?:[ \t]|$)" % re.escape(CUDA_CHECKPOINT_FLAG), re.M)
#: Where ``cuda-checkpoint`` is looked for on the node when the site names none
#: (``checkpoint_store.cuda_checkpoint``): the install locations on PATH of NVIDIA's packages and of a
#: copy of github.com/NVIDIA/cuda-checkpoint's ``bin/x86_64_Linux/cuda-checkpoint``.
CUDA_CHECKPOINT_PATHS = ("/usr/bin/cuda-checkpoint", "/usr/local/bin/cuda-checkpoint", "/usr/sbin/cuda-checkpoint")
#: Where the node's ``cuda-checkpoint`` is bound, read-only, into a GPU sandbox; no user mount may cover it
#: (slurmbox.sandbox.options.RESERVED_DESTINATIONS).
CUDA_CHECKPOINT_MOUNT = "/run/slurmbox-cuda-checkpoint/cuda-checkpoint"
#: Directories the dynamic loader and its configuration come from (ld.so(8): /etc/ld.so.preload,
#: /etc/ld.so.cache, the trusted /lib and /usr/lib directories). gVisor runs ``cuda-checkpoint`` as root
#: of the sandbox, so none of them may come from the user.
LOADER_PATHS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt")
#: Environment variables the dynamic loader and glibc act on in a process started as root without
#: secure-execution mode (ld.so(8) "ENVIRONMENT"; glibc's unsecvars.h), which gVisor's run of
#: cuda-checkpoint is: it gets the spec's process environment, the user's.
LOADER_VARIABLE_PREFIXES = ("LD_", "GLIBC_", "MALLOC_")
LOADER_VARIABLES = ("GCONV_PATH", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH", "NLSPATH", "RESOLV_HOST_CONF",
                    "RES_OPTIONS", "TMPDIR", "TZDIR")


def gpu_checkpoint_flag(checkpoint_help):
    """``CUDA_CHECKPOINT_FLAG`` when ``runsc checkpoint`` lists it, else None.

    ``checkpoint_help``: its ``--help`` output (str), or the parsed flags
    (dict, slurmbox.migrate.runsc_checkpoint.checkpoint_features ``flags``).
    """
    if isinstance(checkpoint_help, dict):
        return CUDA_CHECKPOINT_FLAG if CUDA_CHECKPOINT_FLAG in checkpoint_help else None
    return CUDA_CHECKPOINT_FLAG if _CUDA_CHECKPOINT_LINE.search(checkpoint_help or "") else None


def find_cuda_checkpoint(configured=None):
    """The node's ``cuda-checkpoint`` to bind into GPU sandboxes: (host path, None) or (None, problem).

    ``configured``: the site's ``checkpoint_store.cuda_checkpoint``, else
    CUDA_CHECKPOINT_PATHS are tried in order. gVisor runs the binary as root
    of the sandbox, so it must be root's: the file and every directory above
    it owned by root and writable by no one else (or, for a directory, with
    the sticky bit, like /tmp), an executable regular file. ``problem`` (str) says what
    was wrong and where it looked.
    """
    problems = []
    for path in ([configured] if configured else CUDA_CHECKPOINT_PATHS):
        real = os.path.realpath(path)
        try:
            info = os.stat(real)
        except OSError:
            problems.append("%s: not found" % path)
            continue
        if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o111:
            problems.append("%s: not an executable file" % path)
            continue
        unsafe = _not_roots(real)
        if unsafe:
            problems.append("%s: %s" % (path, unsafe))
            continue
        return real, None
    return None, "; ".join(problems)


def _not_roots(path):
    """Why ``path`` or a directory above it could be changed by someone other than root, or None."""
    current = path
    while True:
        info = os.stat(current)
        if info.st_uid != 0:
            return "%s is owned by uid %d, not root" % (current, info.st_uid)
        # A root-owned sticky directory (/tmp) lets no one else rename or remove what root put in it.
        if info.st_mode & 0o022 and not (current != path and info.st_mode & stat.S_ISVTX):
            return "%s is writable by group or others" % current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def cuda_checkpoint_blockers(image, mount_destinations, environment=(), allowed=False):
    """Why gVisor must not run ``cuda-checkpoint`` as root in this sandbox (list of str, empty = it may).

    gVisor runs it as the sandbox's root with every capability, in the CUDA
    process's own mount namespace and with the sandbox's process
    environment; that root reads the node's files through runsc's gofer
    and every file under the job's bind mounts whatever their permissions.
    So it is used only where the site allows it (``allowed``, the site's
    ``checkpoint_store.allow_cuda_checkpoint``: partitions whose programs are
    trusted not to replace it from inside, e.g. from a user namespace of
    their own) and where what it loads cannot be the user's: ``image``
    (``--sandbox-image``, None = the node's root) unset; no
    ``mount_destinations`` (the user's bind mounts) over LOADER_PATHS or
    over the directories above CUDA_CHECKPOINT_MOUNT (as the node's root
    resolves them: ``/var/run`` is ``/run``); no ``environment`` entry
    ("NAME=value" strings) the loader acts on.
    """
    problems = []
    if not allowed:
        problems.append("the site does not allow it (checkpoint_store.allow_cuda_checkpoint: gVisor runs it as the "
                        "sandbox's root, where the program could replace it)")
    if image:
        problems.append("the sandbox runs in the image %s (--sandbox-image), whose libraries the loader would take" %
                        image)
    for destination in mount_destinations:
        for seen in sorted({destination, os.path.realpath(destination)}):
            covered = [p for p in LOADER_PATHS if seen == p or seen.startswith(p + "/")]
            if covered:
                problems.append("--sandbox-mounts puts a directory at %s, where the loader reads %s"
                                % (destination, covered[0]))
                break
            if CUDA_CHECKPOINT_MOUNT.startswith(seen.rstrip("/") + "/"):
                problems.append("--sandbox-mounts puts a directory at %s, above where cuda-checkpoint is bound (%s)"
                                % (destination, CUDA_CHECKPOINT_MOUNT))
                break
    names = sorted({entry.split("=", 1)[0] for entry in environment if "=" in entry})
    loader = [n for n in names if n.startswith(LOADER_VARIABLE_PREFIXES) or n in LOADER_VARIABLES]
    if loader:
        problems.append("the job's environment sets %s, which the loader would act on (unset them)" % ", ".join(loader))
    return problems


def cuda_checkpoint_flags(checkpoint_help):
    """``runsc checkpoint`` flags (list) that save a GPU sandbox's CUDA state, with the node's binary bound at
    CUDA_CHECKPOINT_MOUNT; [] when this runsc lacks CUDA_CHECKPOINT_FLAG."""
    if gpu_checkpoint_flag(checkpoint_help):
        return ["--%s=%s" % (CUDA_CHECKPOINT_FLAG, CUDA_CHECKPOINT_MOUNT)]
    return []


def refuse_gpu_transparent(settings, device_vendors, checkpoint_help, cuda_checkpoint_problem=None):
    """Settings to use for a sandbox holding devices of ``device_vendors`` (set of "nvidia", "amd", ...).

    Transparent checkpoints cannot save accelerator state unless runsc has
    CUDA_CHECKPOINT_FLAG (NVIDIA only; ``checkpoint_help`` as for
    gpu_checkpoint_flag) and nothing stops it running NVIDIA's
    cuda-checkpoint in this sandbox (``cuda_checkpoint_problem``: why not,
    from find_cuda_checkpoint and cuda_checkpoint_blockers; None when it can,
    or when not known, as at submission). When the user asked for
    transparent mode, or the partition is preemptible, raises
    CheckpointOptionError saying what is missing and to use signal mode;
    otherwise (a site default on a non-preemptible partition) returns
    settings with mode "none".
    """
    if settings.mode != "transparent" or not device_vendors:
        return settings
    unsupported = sorted(v for v in device_vendors if v != "nvidia")
    if not unsupported and gpu_checkpoint_flag(checkpoint_help) and not cuda_checkpoint_problem:
        return settings
    if unsupported:
        what = "%s devices (gVisor cannot checkpoint them)" % ", ".join(unsupported)
    elif not gpu_checkpoint_flag(checkpoint_help):
        what = ("NVIDIA GPUs and this node's runsc has no CUDA checkpoint support (runsc checkpoint "
                "--%s, gVisor releases of 2025 on)" % CUDA_CHECKPOINT_FLAG)
    else:
        what = ("NVIDIA GPUs and NVIDIA's cuda-checkpoint, which runsc runs as root inside the sandbox to save "
                "them, cannot be used: %s" % cuda_checkpoint_problem)
    if settings.explicit or settings.preemptible:
        raise CheckpointOptionError("checkpoint", "transparent",
                                    "the sandbox holds %s; use --sandbox-checkpoint=signal (your program saves "
                                    "its own state on SIGUSR1) or --sandbox-checkpoint=none" % what)
    return CheckpointSettings("none", settings.signal, 0, settings.restore_fallback, False, False)
