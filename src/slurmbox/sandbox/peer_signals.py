"""Follow the signal messages a peer (the task launcher, or srun's proxy in a
batch sandbox) sends while the process it stands for runs."""

import os
import threading

from slurmbox.sandbox.framing import recv_frame


def follow_peer(conn, finished, on_signal, on_gone, on_message=None):
    """Start a daemon thread reading frames from ``conn`` until ``finished`` is set.

    ``on_signal(signum)`` is called for each ``{"signal": N}`` frame;
    ``on_gone()`` once if the peer disconnects (it was killed) before
    ``finished`` is set; ``on_message(frame)`` for any other frame.
    Descriptors a peer tries to pass are closed.
    Returns the thread.
    """
    def follow():
        while not finished.is_set():
            try:
                message, extra = recv_frame(conn)
            except (OSError, ValueError):
                message, extra = None, []
            for fd in extra:
                os.close(fd)
            if message is None:
                if not finished.is_set():
                    on_gone()
                return
            if "signal" in message and not finished.is_set():
                try:
                    on_signal(int(message["signal"]))
                except (OSError, ValueError, TypeError):
                    pass
            elif on_message is not None and isinstance(message, dict):
                on_message(message)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread
