"""Relay a task's stdio to a sandboxed process through descriptors slurmbox owns.

runsc (seen with the 2022 Debian build) fchown()s every stdio descriptor it is
given to the sandbox's unprivileged user (nobody): handing it the task's own
descriptors would change the owner of the job's output file, of the user's
terminal, even of the node's /dev/null. So the sandbox gets fresh pipes (or,
for ``srun --pty``, a fresh pseudo-terminal) and this module copies bytes
between them and the task's descriptors. With a terminal, the task's terminal
is put in raw mode for the session (the inner pty does the line discipline,
as ssh(1) and script(1) do) and window-size changes are copied inward.
"""

import fcntl
import os
import termios
import threading
import tty

from slurmbox.sandbox.framing import write_all

_CHUNK = 1 << 16


def _copy(source, target):
    """Copy bytes from fd ``source`` to fd ``target`` until EOF or error, then close both.

    Each copy owns its two descriptors (duplicates made for it) and is the
    only one to close them, so a number is never reused under a running copy.
    """
    try:
        while True:
            try:
                data = os.read(source, _CHUNK)
            except OSError:  # EIO on a pty master once the slave side is gone
                break
            if not data or not write_all(target, data):
                break
    finally:
        for fd in (source, target):
            try:
                os.close(fd)
            except OSError:
                pass


class StdioRelay:
    """Pipes or a pty between a task's ``(stdin, stdout, stderr)`` fds and a sandboxed process.

    ``child_fds`` are the descriptors to give runsc. Call ``started()`` once
    runsc has them (closes our copies of the child side), and ``finish()``
    after the process ended (waits up to ``timeout`` seconds for buffered
    output, restores the terminal). The task's descriptors stay the caller's:
    the copies work on duplicates of their own.
    """

    def __init__(self, task_fds, use_tty):
        self.task_fds = task_fds
        self.use_tty = bool(use_tty) and os.isatty(task_fds[0])
        self.saved_mode = None
        self.threads = []
        self.control = None  # pty master kept for window-size changes
        if self.use_tty:
            master, slave = os.openpty()
            self.control = os.dup(master)
            self.resize()
            self.saved_mode = termios.tcgetattr(task_fds[0])
            tty.setraw(task_fds[0])
            self.child_fds = (slave, slave, slave)
            self._jobs = [(os.dup(task_fds[0]), master, False), (os.dup(master), os.dup(task_fds[1]), True)]
        else:
            in_read, in_write = os.pipe()
            out_read, out_write = os.pipe()
            err_read, err_write = os.pipe()
            self.child_fds = (in_read, out_write, err_write)
            self._jobs = [(os.dup(task_fds[0]), in_write, False), (out_read, os.dup(task_fds[1]), True),
                          (err_read, os.dup(task_fds[2]), True)]

    def resize(self):
        """Copy the task terminal's window size to the inner pty (TIOCGWINSZ/TIOCSWINSZ, tty_ioctl(4))."""
        if self.control is not None:
            try:
                size = fcntl.ioctl(self.task_fds[0], termios.TIOCGWINSZ, b"\0" * 8)
                fcntl.ioctl(self.control, termios.TIOCSWINSZ, size)
            except OSError:
                pass

    def started(self):
        """runsc holds the child side now: close ours and start copying."""
        for fd in set(self.child_fds):
            os.close(fd)
        for source, target, is_output in self._jobs:
            thread = threading.Thread(target=_copy, args=(source, target), daemon=True)
            thread.start()
            if is_output:
                self.threads.append(thread)

    def finish(self, timeout=5.0):
        """Wait for the output copies to drain, then restore the task's terminal."""
        for thread in self.threads:
            thread.join(timeout)
        if self.saved_mode is not None:
            try:
                termios.tcsetattr(self.task_fds[0], termios.TCSADRAIN, self.saved_mode)
            except termios.error:
                pass
        if self.control is not None:
            os.close(self.control)
            self.control = None
