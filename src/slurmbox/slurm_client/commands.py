"""The one place slurmbox runs a Slurm client command (scontrol, squeue, sinfo, srun's
checks): as a subprocess with the given environment, stdout returned, failures raised."""

import subprocess


class SlurmCommandError(RuntimeError):
    """A Slurm command exited non-zero or could not be started; ``str()`` says which and why."""


def run_command(argv, env=None, timeout=30):
    """Run a Slurm client command; returns its stdout (str).

    Raises SlurmCommandError with the command and its stderr when it fails.
    """
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SlurmCommandError("%s: %s" % (" ".join(argv), err)) from err
    if proc.returncode != 0:
        raise SlurmCommandError("%s failed (exit %d): %s" % (" ".join(argv), proc.returncode,
                                                             proc.stderr.strip() or proc.stdout.strip()))
    return proc.stdout
