"""The wire format between slurmbox's step processes: launcher, supervisor, step broker,
control socket (standard library only).

Frames of a 4-byte big-endian length followed by that many bytes of UTF-8 JSON;
a frame may carry file descriptors as SCM_RIGHTS ancillary data (unix(7)).
The launcher is installed as one standalone script (spank_plugin/install.py
inlines this module into it), so this module imports nothing of slurmbox.
"""

import array
import json
import os
import socket
import struct

#: Exit code for "the sandbox could not run the command" (docker/podman use 125 alike).
EXIT_SANDBOX_FAILED = 125
_HEADER = struct.Struct(">I")
#: Largest frame accepted (bytes).
MAX_FRAME = 16 << 20


def send_frame(sock, message, fds=()):
    """Send one JSON frame, optionally with file descriptors (list of int)."""
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sent = sock.sendmsg([payload], ancillary)
        payload = payload[sent:]
    if payload:
        sock.sendall(payload)


def _recv_exact(sock, size, fds):
    chunks = []
    while size:
        data, ancdata, _flags, _addr = sock.recvmsg(size, socket.CMSG_SPACE(16 * 4))
        for level, kind, cdata in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fd_array = array.array("i")
                fd_array.frombytes(cdata[: len(cdata) - (len(cdata) % fd_array.itemsize)])
                fds.extend(fd_array)
        if not data:
            return None
        chunks.append(data)
        size -= len(data)
    return b"".join(chunks)


def recv_frame(sock):
    """Receive one frame.

    Returns ``(message, fds)``: the decoded JSON object and the list of file
    descriptors that came with it, or ``(None, [])`` at end of stream.
    Raises ValueError for an oversized or malformed frame.
    """
    fds = []
    header = _recv_exact(sock, _HEADER.size, fds)
    if header is None:
        return None, fds
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError("frame of %d bytes exceeds the limit" % size)
    body = _recv_exact(sock, size, fds)
    if body is None:
        return None, fds
    return json.loads(body), fds


def write_all(fd, data):
    """Write all of ``data`` (bytes) to ``fd``. Returns False if the descriptor failed (closed, EPIPE)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError:
            return False
    return True
