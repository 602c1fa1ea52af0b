"""Framing of the harness <-> candidate channel (a unix stream socket).

One message is::

    4 bytes   big-endian length H of the JSON header (H <= MAX_HEADER)
    H bytes   UTF-8 JSON object: {"op": str, ..., "arrays": [{"name", "dtype", "shape"}, ...]}
    payload   the arrays' raw C-order bytes, back to back, in header order

Only numeric dtypes from ALLOWED_DTYPES are accepted and nothing is ever
unpickled: the harness parses what an untrusted candidate sends with
``numpy.frombuffer`` after checking every size against a limit. This module
imports only the standard library and numpy, because it is also copied into
the sandbox next to ``runner.py``.

Operations (see ``runner.py``): harness -> candidate ``run`` (id, inputs) and
``exit``; candidate -> harness ``hello``, ``result`` (id, claimed_ns, one
output array) and ``error`` (id, message).
"""

import json
import struct

import numpy as np

MAX_HEADER = 64 * 1024
MAX_ARRAYS = 64
MAX_NDIM = 8
#: numpy dtype strings accepted on the channel (little-endian numeric types only).
ALLOWED_DTYPES = ("<f2", "<f4", "<f8", "<c8", "<c16", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "|b1")


class ProtocolError(ValueError):
    """The peer sent something that is not a well-formed message within the limits."""


class PeerClosed(ProtocolError):
    """The peer closed the channel (end of stream) before a whole message arrived."""


def recv_exact(sock, size):
    """Read exactly ``size`` bytes from stream socket ``sock`` into a new bytearray.

    Raises PeerClosed when the stream ends first; socket.timeout/OSError pass through.
    """
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        count = sock.recv_into(view[got:], size - got)
        if count == 0:
            raise PeerClosed("channel closed after %d of %d bytes" % (got, size))
        got += count
    return buffer


def encode(header, arrays=()):
    """Serialise ``header`` (dict) and ``arrays`` (list of (name, ndarray)) into one message (list of buffers)."""
    meta = []
    buffers = []
    for name, array in arrays:
        array = np.ascontiguousarray(array)
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        array = array.astype(dtype, copy=False)
        if array.dtype.str not in ALLOWED_DTYPES:
            raise ProtocolError("dtype %s is not allowed on the channel (allowed: %s)"
                                % (array.dtype.str, ", ".join(ALLOWED_DTYPES)))
        meta.append({"name": str(name), "dtype": array.dtype.str, "shape": list(array.shape)})
        buffers.append(memoryview(array).cast("B") if array.size else b"")
    body = dict(header)
    body["arrays"] = meta
    raw = json.dumps(body, separators=(",", ":")).encode()
    if len(raw) > MAX_HEADER:
        raise ProtocolError("header of %d bytes exceeds %d" % (len(raw), MAX_HEADER))
    return [struct.pack("!I", len(raw)) + raw] + buffers


def send(sock, header, arrays=()):
    """Send one message on ``sock`` (see module doc). Raises ProtocolError or OSError."""
    for buffer in encode(header, arrays):
        if len(buffer):
            sock.sendall(buffer)


def recv_header(sock):
    """Read the next message's header. Returns the dict (with its "arrays" list validated).

    Raises ProtocolError on a malformed header, PeerClosed at end of stream.
    """
    (length,) = struct.unpack("!I", bytes(recv_exact(sock, 4)))
    if length == 0 or length > MAX_HEADER:
        raise ProtocolError("header length %d is outside 1..%d" % (length, MAX_HEADER))
    try:
        header = json.loads(bytes(recv_exact(sock, length)).decode())
    except (UnicodeDecodeError, ValueError) as err:
        raise ProtocolError("header is not JSON: %s" % err)
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise ProtocolError("header is not an object with a string 'op'")
    arrays = header.get("arrays", [])
    if not isinstance(arrays, list) or len(arrays) > MAX_ARRAYS:
        raise ProtocolError("'arrays' must be a list of at most %d entries" % MAX_ARRAYS)
    for entry in arrays:
        if not isinstance(entry, dict) or entry.get("dtype") not in ALLOWED_DTYPES:
            raise ProtocolError("array entry %r has no allowed dtype" % (entry,))
        shape = entry.get("shape")
        if not isinstance(shape, list) or len(shape) > MAX_NDIM or \
                not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2 ** 40 for d in shape):
            raise ProtocolError("array entry %r has an invalid shape" % (entry,))
    return header


def payload_size(header):
    """Bytes of payload announced by ``header`` (validated by recv_header)."""
    total = 0
    for entry in header.get("arrays", []):
        count = 1
        for dim in entry["shape"]:
            count *= dim
        total += count * np.dtype(entry["dtype"]).itemsize
    return total


def recv_arrays(sock, header, max_bytes):
    """Read the payload announced by ``header``; returns a list of (name, read-only ndarray).

    Raises ProtocolError when the payload exceeds ``max_bytes``.
    """
    size = payload_size(header)
    if size > max_bytes:
        raise ProtocolError("payload of %d bytes exceeds the limit of %d" % (size, max_bytes))
    raw = recv_exact(sock, size) if size else bytearray()
    out = []
    offset = 0
    for entry in header.get("arrays", []):
        dtype = np.dtype(entry["dtype"])
        count = 1
        for dim in entry["shape"]:
            count *= dim
        nbytes = count * dtype.itemsize
        array = np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(entry["shape"])
        offset += nbytes
        out.append((str(entry.get("name", "")), array))
    return out


class PipeChannel:
    """A socket-like channel over a pair of pipe file descriptors (Slurm mode: the step's
    stdin/stdout). Offers the calls this module and the harness use: ``recv_into``,
    ``sendall``, ``settimeout``, ``pending`` and ``close``. ``read_fd``/``write_fd``: ints."""

    def __init__(self, read_fd, write_fd):
        self.read_fd, self.write_fd = read_fd, write_fd
        self.timeout = None

    def settimeout(self, timeout):
        self.timeout = timeout

    def _wait(self, fd, readable):
        import select
        import socket
        if self.timeout is None:
            return
        ready = select.select([fd] if readable else [], [] if readable else [fd], [], self.timeout)
        if not any(ready[:2]):
            raise socket.timeout("timed out")

    def recv_into(self, view, size):
        import os
        self._wait(self.read_fd, True)
        data = os.read(self.read_fd, size)
        view[:len(data)] = data
        return len(data)

    def sendall(self, data):
        import os
        view = memoryview(data).cast("B")
        while len(view):
            self._wait(self.write_fd, False)
            view = view[os.write(self.write_fd, view):]

    def pending(self):
        """True when bytes (or end of stream) wait to be read."""
        import select
        return bool(select.select([self.read_fd], [], [], 0)[0])

    def close(self):
        import os
        for fd in {self.read_fd, self.write_fd}:
            try:
                os.close(fd)
            except OSError:
                pass
