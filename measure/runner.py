"""Candidate-side glue, run INSIDE the sandbox: ``python3 -I runner.py CANDIDATE.py SOCKET``.

It imports the candidate module (entry point ``run(**inputs) -> ndarray``),
listens on the unix socket ``SOCKET`` (a private directory bound into the
sandbox; runsc ``--host-uds=create`` lets the sandbox create it, never
connect out) and serves the harness: ``hello`` once, then for every ``run``
request calls the candidate on the received arrays and answers ``result``
with the output array and ``claimed_ns`` (its own perf_counter reading around
the call) or ``error``.

Nothing this process says is trusted: it shares its address space with the
candidate, which may patch any of it. The harness reads its own clock around
each request/response, checks every output against the trusted reference and
treats ``claimed_ns`` only as a claim to cross-check. Imports only the
standard library, numpy and protocol.py (copied next to this file).
"""

import importlib.util
import os
import socket
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402  (the copy next to this file)

MAX_INPUT_BYTES = 1 << 34


def load_candidate(path):
    """Import the candidate file at ``path``; returns its ``run`` callable. Raises on any failure."""
    spec = importlib.util.spec_from_file_location("candidate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["candidate"] = module
    spec.loader.exec_module(module)
    entry = getattr(module, "run", None)
    if not callable(entry):
        raise TypeError("candidate %s defines no callable run(**inputs)" % path)
    return entry


def serve(entry, conn):
    """Answer requests on ``conn`` until ``exit`` or end of stream."""
    while True:
        try:
            header = protocol.recv_header(conn)
        except protocol.PeerClosed:
            return
        if header["op"] == "exit":
            return
        arrays = protocol.recv_arrays(conn, header, MAX_INPUT_BYTES)
        inputs = {name: array for name, array in arrays}
        started = time.perf_counter_ns()
        try:
            output = entry(**inputs)
            import numpy as np
            output = np.asarray(output)
        except Exception:  # the candidate's own failure, reported to the harness
            protocol.send(conn, {"op": "error", "id": header.get("id"),
                                 "error": traceback.format_exc(limit=5)[-2000:]})
            continue
        claimed = time.perf_counter_ns() - started
        try:
            protocol.send(conn, {"op": "result", "id": header.get("id"), "claimed_ns": claimed},
                          [("output", output)])
        except protocol.ProtocolError as err:
            protocol.send(conn, {"op": "error", "id": header.get("id"), "error": str(err)})


def main(argv):
    candidate_path, socket_path = argv[1], argv[2]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(1)
    conn, _ = listener.accept()
    listener.close()
    try:
        entry = load_candidate(candidate_path)
    except BaseException:
        protocol.send(conn, {"op": "error", "id": None, "error": traceback.format_exc(limit=5)[-2000:]})
        return 3
    protocol.send(conn, {"op": "hello", "pid": os.getpid()})
    serve(entry, conn)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
