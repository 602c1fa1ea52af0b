"""Remove everything a step's sandbox left on this node.

Run by the SPANK shim at the end of every sandboxed step (``slurm_spank_exit``,
root, after the tasks ended, also after scancel, time limit or a crash) and by
the supervisor itself on a normal end. Idempotent: kills the supervisor if it
still runs, kills and deletes the runsc container (``runsc kill``, ``runsc
delete --force``), removes the step's cgroups (sandbox/step_cgroup.py), and
removes the step's runtime directory (socket, bundle, pid files) and its alias.
"""

import argparse
import os
import shutil
import signal
import sys

from slurmbox.sandbox import runsc, step_dirs


def container_id_of(step_dir):
    """runsc container id of the step whose runtime directory is ``step_dir``
    (``<job>.<step>.<incarnation>``, sandbox/step_dirs.py): unique per incarnation."""
    return "slurmbox-" + os.path.basename(os.path.normpath(step_dir))


def supervisor_pid(step_dir, *aliases):
    """Pid of the step's live supervisor (from ``supervisor.pid``), or None.

    The pid counts only while its command line names the supervisor module and
    this step directory (or one of ``aliases``), so a reused pid is never taken.
    """
    try:
        with open(os.path.join(step_dir, "supervisor.pid")) as handle:
            pid = int(handle.read().strip())
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            cmdline = handle.read().split(b"\0")
    except (OSError, ValueError):
        return None
    names = {step_dir.encode()} | {alias.encode() for alias in aliases}
    if b"slurmbox.step.supervisor" not in cmdline or not names.intersection(cmdline):
        return None
    return pid


def _stop_supervisor(step_dir, *aliases):
    pid = supervisor_pid(step_dir, *aliases)
    if pid is None or pid == os.getpid():
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def remove_step(step_dir, runtime_dir):
    """Tear down the sandbox of ``step_dir`` (a directory under ``runtime_dir``).

    Refuses paths outside ``runtime_dir`` (raises ValueError). Safe to call
    repeatedly and concurrently.
    """
    given, step_dir = step_dir, os.path.realpath(step_dir)
    if not step_dir.startswith(os.path.realpath(runtime_dir) + os.sep):
        raise ValueError("%s is not inside the runtime directory %s" % (step_dir, runtime_dir))
    _stop_supervisor(step_dir, given)
    state_root = os.path.join(os.path.dirname(step_dir), runsc.RUNSC_STATE_SUBDIR)
    container = container_id_of(step_dir)
    try:
        binary = runsc.find_runsc()
    except runsc.RunscError:
        binary = None
    if binary and _has_state(state_root, container):
        runsc.kill([binary, "--root", state_root], container, "KILL", all_processes=True)
        runsc.delete([binary, "--root", state_root], container)
    _remove_cgroup(step_dir, runtime_dir)
    _remove_tree(step_dir)
    step_dirs.remove_alias(step_dir)


def _remove_tree(step_dir):
    """Remove the step directory; its staging binds (user_paths.py) only through
    remove_staging, which never descends into one, so the user's files are never touched."""
    from slurmbox.sandbox import user_paths

    left = user_paths.remove_staging(step_dir)
    if not left:
        shutil.rmtree(step_dir, ignore_errors=True)
        return
    for name in os.listdir(step_dir) if os.path.isdir(step_dir) else []:
        if name != user_paths.STAGING_SUBDIR:
            path = os.path.join(step_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
    sys.stderr.write("slurmbox cleanup: left %s (still mounted)\n" % ", ".join(left))


def _remove_cgroup(step_dir, runtime_dir):
    """Remove the step's cgroups (sandbox/step_cgroup.py) named in root's record of the sandbox (registry)."""
    import json

    from slurmbox.sandbox import step_cgroup

    try:
        with open(os.path.join(step_dir, "sandbox.json")) as handle:  # registry.RECORD_NAME: root-owned, 0600
            record = json.load(handle)
        dirs = (record.get("cpu_accounting") or {}).get("dirs") or []
        name = step_cgroup.cgroup_name(record["job"], record["step"], record["node"], runtime_dir)
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return
    step_cgroup.remove(dirs, name)


def _has_state(state_root, container):
    """True when runsc keeps state for ``container`` under ``state_root``.

    runsc names it ``<id>/`` (older releases) or ``<id>_sandbox:<id>.state``
    and ``.lock`` files (seen with the 2022 build); checking the directory
    avoids starting runsc when ``runsc run`` already cleaned up after itself.
    """
    try:
        entries = os.listdir(state_root)
    except OSError:
        return False
    return any(name == container or name.startswith(container + "_") for name in entries)


def main(argv=None):
    """``python -m slurmbox.sandbox.cleanup --step-dir DIR --runtime-dir DIR``."""
    parser = argparse.ArgumentParser(prog="slurmbox-cleanup")
    parser.add_argument("--step-dir", required=True)
    parser.add_argument("--runtime-dir", required=True)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    remove_step(args.step_dir, args.runtime_dir)


if __name__ == "__main__":
    main()
