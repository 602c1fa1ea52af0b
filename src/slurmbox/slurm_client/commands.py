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


def run_status(argv, env=None, timeout=20, input=""):
    """Run a command -> ``(exit status, stdout and stderr)``; never raises (127: not installed,
    124: timed out, 126: could not start). stdin is a pipe holding ``input`` (str)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, input=input)
    except FileNotFoundError:
        return 127, "%s: not installed" % argv[0]
    except subprocess.TimeoutExpired:
        return 124, "%s did not finish within %d s" % (" ".join(argv), timeout)
    except OSError as err:
        return 126, "%s: %s" % (argv[0], err)
    return proc.returncode, (proc.stdout + proc.stderr).strip()
