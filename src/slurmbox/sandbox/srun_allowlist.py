"""The srun options a sandboxed batch script may give the host ``srun`` (the step broker's allowlist).

The step broker (slurmbox.step.step_broker) runs the real ``srun`` on the
node, outside the sandbox, as the job's user. An option that makes srun or
slurmstepd run a program the user names (``--prolog``, ``--task-prolog``,
``--container``...), act on another job (``--jobid``) or cluster
(``--clusters``), or copy files (``--bcast``) would run the user's code on the
host. So the host srun's argv is rebuilt from this allowlist; anything else is
refused with a message naming the option. The reason for keeping each option
is in ``ALLOWED``; README ("Security model") lists them. A later feature
that needs another srun option adds it here, with its reason.

Parsing follows srun's own (getopt_long with ``+``: options end at the first
word that is not one, or at ``--``), except that long options must be spelled
out in full: getopt would take a prefix such as ``--jobi=5`` for ``--jobid``,
and a prefix is never matched here. Source of the option names and argument
kinds: srun(1) of Slurm 22.05.
"""

from dataclasses import dataclass

NO, REQUIRED, OPTIONAL = "no", "required", "optional"

#: long name -> (short letter or None, argument kind, why it is safe from inside a sandbox).
ALLOWED = {
    "ntasks": ("n", REQUIRED, "step shape within the job's allocation"),
    "nodes": ("N", REQUIRED, "step shape within the job's allocation"),
    "cpus-per-task": ("c", REQUIRED, "step shape within the job's allocation"),
    "ntasks-per-node": (None, REQUIRED, "step shape"),
    "ntasks-per-socket": (None, REQUIRED, "step shape"),
    "ntasks-per-core": (None, REQUIRED, "step shape"),
    "ntasks-per-gpu": (None, REQUIRED, "step shape"),
    "threads-per-core": (None, REQUIRED, "step shape"),
    "hint": (None, REQUIRED, "step shape"),
    "distribution": ("m", REQUIRED, "task placement"),
    "cpu-bind": (None, REQUIRED, "task placement"),
    "mem-bind": (None, REQUIRED, "task placement"),
    "gpu-bind": (None, REQUIRED, "task placement"),
    "mem": (None, REQUIRED, "a share of the job's memory"),
    "mem-per-cpu": (None, REQUIRED, "a share of the job's memory"),
    "mem-per-gpu": (None, REQUIRED, "a share of the job's memory"),
    "gres": (None, REQUIRED, "a share of the job's gres; the step start checks it against slurmctld"),
    "gpus": ("G", REQUIRED, "a share of the job's GPUs"),
    "gpus-per-node": (None, REQUIRED, "a share of the job's GPUs"),
    "gpus-per-task": (None, REQUIRED, "a share of the job's GPUs"),
    "gpus-per-socket": (None, REQUIRED, "a share of the job's GPUs"),
    "cpus-per-gpu": (None, REQUIRED, "a share of the job's CPUs"),
    "exact": (None, NO, "a share of the job's CPUs"),
    "exclusive": (None, NO, "steps of this job do not share CPUs"),
    "overlap": (None, NO, "shares resources with other steps of this same job only (the job id is forced)"),
    "nodelist": ("w", REQUIRED, "nodes of this job's allocation only (slurmctld refuses others)"),
    "exclude": ("x", REQUIRED, "nodes of this job's allocation only"),
    "relative": ("r", REQUIRED, "nodes of this job's allocation only"),
    "time": ("t", REQUIRED, "within the job's own time limit"),
    "signal": (None, REQUIRED, "signals this step's own tasks"),
    "kill-on-bad-exit": ("K", OPTIONAL, "ends this step's own tasks"),
    "wait": ("W", REQUIRED, "ends this step's own tasks"),
    "disable-status": ("X", NO, "srun's own signal handling"),
    "quiet": ("Q", NO, "srun's own messages"),
    "verbose": ("v", NO, "srun's own messages"),
    "label": ("l", NO, "output formatting"),
    "unbuffered": ("u", NO, "output formatting"),
    "output": ("o", REQUIRED, "a file slurmstepd writes as the job's user"),
    "error": ("e", REQUIRED, "a file slurmstepd writes as the job's user"),
    "input": ("i", REQUIRED, "a file slurmstepd reads as the job's user"),
    "open-mode": (None, REQUIRED, "how those files are opened"),
    "job-name": ("J", REQUIRED, "a label only (never read back for a decision)"),
    "chdir": ("D", REQUIRED, "the tasks' working directory, entered as the job's user"),
    "pty": (None, NO, "a terminal for task 0"),
    "export": (None, REQUIRED, "which variables the step's tasks get (they run sandboxed or as the user)"),
    "mpi": (None, REQUIRED, "the MPI plugin the site installed"),
    "multi-prog": (None, NO, "the step start refuses or sandboxes it (Slurm < 23.11: refused)"),
    "sandbox": (None, OPTIONAL, "slurmbox's own options, checked by the step's supervisor"),
    "sandbox-image": (None, REQUIRED, "slurmbox's own options"),
    "sandbox-mounts": (None, REQUIRED, "slurmbox's own options"),
    "sandbox-workdir": (None, REQUIRED, "slurmbox's own options"),
    "sandbox-network": (None, REQUIRED, "slurmbox's own options (limited by the partition's profiles)"),
    "sandbox-dry-run": (None, NO, "slurmbox's own options"),
    "sandbox-checkpoint": (None, REQUIRED, "slurmbox's own options"),
    "sandbox-checkpoint-interval": (None, REQUIRED, "slurmbox's own options"),
    "no-sandbox": (None, NO, "the user's own job; refused here and at the step start where the partition "
                             "requires sandboxing"),
}
_BY_SHORT = {short: name for name, (short, _kind, _why) in ALLOWED.items() if short}

#: srun input environment variables (srun(1) INPUT ENVIRONMENT VARIABLES) that stand for options outside
#: the allowlist, or that slurmbox sets itself: never passed to the host srun from the sandbox.
REFUSED_INPUT_VARIABLES = (
    "SLURM_PROLOG", "SLURM_EPILOG", "SLURM_TASK_PROLOG", "SLURM_TASK_EPILOG", "SLURM_CONTAINER",
    "SRUN_CONTAINER", "SLURM_BCAST", "SLURM_CLUSTERS", "SLURM_TEST_EXEC", "SLURM_PARTITION", "SLURM_ACCOUNT",
    "SLURM_QOS", "SLURM_RESERVATION", "SLURM_DEPENDENCY", "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CONF",
    "SLURM_WCKEY", "SLURM_NETWORK", "SLURM_PROFILE", "SLURM_COMPRESS", "SLURM_DEBUG_FLAGS", "SLURMD_DEBUG",
    "SLURM_CPU_FREQ_REQ", "SLURM_GPU_FREQ", "SLURM_POWER", "SLURM_CORE_SPEC", "SLURM_THREAD_SPEC",
    "SLURM_DELAY_BOOT", "SLURM_REQ_SWITCH", "SLURM_WAIT4SWITCH", "SLURM_RESV_PORTS",
)
#: Prefixes of variables that set SPANK options (plugstack) from the environment, or that slurmbox owns.
REFUSED_INPUT_PREFIXES = ("SLURM_SPANK_", "_SLURM_SPANK_", "SLURMBOX_", "SLURM_HET_")
#: Except slurmbox's own options of the job (``#SBATCH --sandbox...``), which Slurm hands every step of the
#: job as job SPANK environment (seen on 22.05: ``SLURM_SPANK__SLURM_SPANK_OPTION_slurmbox_sandbox=(null)``);
#: the step's supervisor checks them like command-line options (``--no-sandbox`` stays refused on required
#: partitions there).
KEPT_SPANK_PREFIX = "SLURM_SPANK__SLURM_SPANK_OPTION_slurmbox_"


class RefusedOption(ValueError):
    """An srun option outside the broker's allowlist; ``str()`` names it and says what to do."""


@dataclass(frozen=True)
class SrunRequest:
    """A checked srun command line: ``options`` (list of (long name, value or None)) and ``command``."""

    options: tuple
    command: tuple

    def argv(self, srun_path):
        """The host srun's argv (long options spelled out, ``--`` before the command)."""
        words = [srun_path]
        for name, value in self.options:
            words.append("--%s" % name if value is None else "--%s=%s" % (name, value))
        return words + ["--"] + list(self.command)


def _refuse(word, why):
    raise RefusedOption("srun option %s %s; srun inside a sandbox accepts only the options listed in the README "
                        "(Security model: srun inside a sandboxed batch script)" % (word, why))


def parse_srun_args(args, partition_requires_sandbox):
    """Check srun's arguments (``args``: list of str, without "srun") against ALLOWED.

    Returns an SrunRequest. Raises RefusedOption for an option outside the
    allowlist, an abbreviated long option, a missing or unexpected value, no
    command, or ``--no-sandbox`` where the partition requires sandboxing.
    """
    options, index = [], 0
    args = [str(a) for a in args]
    while index < len(args):
        word = args[index]
        if word == "--":
            index += 1
            break
        if not word.startswith("-") or word == "-":
            break
        index += 1
        if word.startswith("--"):
            name, has_value, value = word[2:].partition("=")
            if name not in ALLOWED:
                _refuse("--%s" % name, "is not allowed here (long options must be spelled out in full)")
            _short, kind, _why = ALLOWED[name]
            if kind == NO and has_value:
                _refuse("--%s" % name, "takes no value")
            if kind == REQUIRED and not has_value:
                if index >= len(args):
                    _refuse("--%s" % name, "needs a value")
                value, has_value = args[index], True
                index += 1
            options.append((name, value if has_value else None))
            continue
        letters = word[1:]
        while letters:
            letter, letters = letters[0], letters[1:]
            name = _BY_SHORT.get(letter)
            if name is None:
                _refuse("-%s" % letter, "is not allowed here")
            kind = ALLOWED[name][1]
            if kind == NO:
                options.append((name, None))
                continue
            if letters:  # -n4, -K1: the rest of the word is the value
                options.append((name, letters))
            elif kind == REQUIRED:
                if index >= len(args):
                    _refuse("-%s" % letter, "needs a value")
                options.append((name, args[index]))
                index += 1
            else:
                options.append((name, None))
            letters = ""
    command = tuple(args[index:])
    if not command:
        raise RefusedOption("srun needs a command to run")
    if partition_requires_sandbox and any(name == "no-sandbox" for name, _ in options):
        raise RefusedOption("srun --no-sandbox: this job's partition requires sandboxing; remove --no-sandbox")
    return SrunRequest(tuple(options), command)


def host_srun_environment(requested):
    """The variables of ``requested`` (dict) that may reach the host srun: without REFUSED_INPUT_VARIABLES
    and REFUSED_INPUT_PREFIXES (the caller adds this job's SLURM_JOB_ID and SLURM_CONF)."""
    return {str(k): str(v) for k, v in dict(requested).items()
            if str(k) not in REFUSED_INPUT_VARIABLES
            and (str(k).startswith(KEPT_SPANK_PREFIX) or not str(k).startswith(REFUSED_INPUT_PREFIXES))}
