"""Task-side launcher: runs as the job's user in front of every sandboxed task.

The SPANK shim puts this script in front of the task's argv. It imports only the
standard library (it runs with ``python -IS`` on every step's start path) and
does no privileged work: it connects to the step's root-run supervisor over the
Unix socket named by ``SLURMBOX_SUPERVISOR_SOCKET``, passes its argv,
environment, working directory and its stdin/stdout/stderr file descriptors
(SCM_RIGHTS, unix(7)), forwards the signals Slurm sends the task, and finally
exits the way the sandboxed process did (same exit code, or the same signal).

Wire format: sandbox/framing.py; the first frame from the launcher carries
three file descriptors as ancillary data.
"""

import json
import os
import signal
import socket
import sys

# spank_plugin/install.py replaces the next line with framing.py's text (the launcher is one file).
from slurmbox.sandbox.framing import EXIT_SANDBOX_FAILED, recv_frame, send_frame, write_all  # noqa: F401

#: Signals Slurm may deliver to a task (scancel, --signal, time limit, srun ^C).
FORWARDED_SIGNALS = (
    signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGALRM, signal.SIGCONT, signal.SIGTSTP, signal.SIGWINCH,
)
#: Seconds srun's proxy waits for the step broker to connect.
BROKER_TIMEOUT = 30
#: Signals whose default action stops rather than terminates (signal(7)).
_STOP_SIGNALS = (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def _task_argv():
    argv0 = os.environ.pop("SLURMBOX_TASK_ARGV0", None)
    if argv0 is not None:  # Slurm < 23.11: argv[0] was replaced by this script
        return [argv0] + sys.argv[1:]
    return sys.argv[1:]


def _exit_like(result):
    """Leave the process the way the sandboxed process left (never returns)."""
    sys.stdout.flush()
    if "signal" in result:
        signum = int(result["signal"])
        if 0 < signum < signal.NSIG and signum not in _STOP_SIGNALS and signum != signal.SIGCONT:
            for sig in FORWARDED_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            try:
                signal.signal(signum, signal.SIG_DFL)  # SIGKILL cannot be caught, nor reset
            except (OSError, ValueError):
                pass
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
            os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(int(result.get("exit", EXIT_SANDBOX_FAILED)))


def main():
    """Entry point; returns only through os._exit."""
    socket_path = os.environ.pop("SLURMBOX_SUPERVISOR_SOCKET", "")
    argv = _task_argv()
    if not socket_path or not argv:
        sys.stderr.write("slurmbox: the launcher was started outside a sandboxed Slurm step\n")
        os._exit(EXIT_SANDBOX_FAILED)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path)
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = os.environ.get("PWD", "/")
        request = {"argv": argv, "env": dict(os.environ), "cwd": cwd, "tty": os.isatty(0)}
        send_frame(conn, request, fds=[0, 1, 2])
    except OSError as err:
        sys.stderr.write("slurmbox: cannot reach the step's sandbox supervisor at %s: %s\n"
                         "slurmbox: ask the cluster admin to check the slurmbox plugin on this node\n"
                         % (socket_path, err))
        os._exit(EXIT_SANDBOX_FAILED)

    _relay_until_exit(conn)


def _relay_until_exit(conn, carries_output=False):
    """Forward our signals over ``conn`` and exit as the remote process did.

    With ``carries_output`` (srun's proxy), ``{"fd": 1|2, "data": hex}``
    frames are written to our stdout/stderr; otherwise the other side holds
    our stdio itself and our copies of stdin/stdout are dropped.
    """
    def forward(signum, _frame):
        try:
            send_frame(conn, {"signal": signum})
        except OSError:
            pass

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    if not carries_output:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):
            os.dup2(devnull, fd)
    while True:
        try:
            message, _fds = recv_frame(conn)
        except InterruptedError:
            continue
        except (OSError, ValueError) as err:
            message = {"error": "lost the sandbox supervisor: %s" % err}
        if message is None:
            message = {"error": "the sandbox supervisor went away before the task ended"}
        if carries_output and message.get("fd") in (1, 2):
            write_all(message["fd"], bytes.fromhex(message.get("data", "")))
            continue
        if "error" in message:
            sys.stderr.write("slurmbox: %s\n" % message["error"])
            _exit_like({"exit": message.get("exit", EXIT_SANDBOX_FAILED)})
        if "exit" in message or "signal" in message:
            _exit_like(message)


def _send_stdin(conn):
    """Copy our stdin to the broker as ``{"stdin": hex}`` frames, then ``{"stdin_eof": true}``."""
    try:
        while True:
            data = os.read(0, 1 << 16)
            if not data:
                break
            send_frame(conn, {"stdin": data.hex()})
        send_frame(conn, {"stdin_eof": True})
    except OSError:
        pass


def proxy_main():
    """``srun`` inside a sandboxed batch step: ask the step broker to run it.

    Creates a listening socket in the broker directory (``SLURMBOX_STEP_BROKER``),
    waits for the broker to connect, sends argv/environment/cwd, relays stdin,
    stdout and stderr over the connection, then exits as the real srun did.
    See slurmbox.step.step_broker.
    """
    broker = os.environ.get("SLURMBOX_STEP_BROKER")
    if not broker:
        sys.stderr.write("slurmbox: srun is not available inside this sandbox (no step broker)\n")
        os._exit(EXIT_SANDBOX_FAILED)
    path = os.path.join(broker, "%d-%s.sock" % (os.getpid(), os.urandom(6).hex()))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(BROKER_TIMEOUT)
    try:
        conn, _addr = listener.accept()
    except OSError:
        sys.stderr.write("slurmbox: the step broker did not answer within %d s; srun cannot run from this "
                         "sandbox\n" % BROKER_TIMEOUT)
        os._exit(EXIT_SANDBOX_FAILED)
    conn.settimeout(None)
    listener.close()
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = ""
    send_frame(conn, {"argv": ["srun"] + sys.argv[1:], "env": dict(os.environ), "cwd": cwd})
    import threading  # only srun's proxy needs a second thread
    threading.Thread(target=_send_stdin, args=(conn,), daemon=True).start()
    _relay_until_exit(conn, carries_output=True)


def dispatch():
    """Run as the task launcher, or as the in-sandbox srun proxy when called ``srun``."""
    if os.path.basename(sys.argv[0]) == "srun":
        proxy_main()
    else:
        main()


if __name__ == "__main__":
    dispatch()
