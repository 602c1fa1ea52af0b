"""Candidate-side glue, run INSIDE the sandbox: ``python3 -I runner.py CANDIDATE.py SOCKET``
(local mode) or ``python3 -I runner.py --stdio CANDIDATE.py`` (Slurm mode: the channel is
the step's stdin/stdout, moved off fd 0/1 before the candidate is imported).

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
#: Set by the harness when the sandbox holds GPUs: flush L2 before every call and
#: synchronise the whole device before answering.
GPU = os.environ.get("SLURMBOX_MEASURE_GPU") == "1"


class _Gpu:
    """Device hygiene around each call, when torch and a CUDA device are present.

    Before the call: reset persisting-L2 lines (cudaCtxResetPersistingL2Cache,
    CUDA runtime API) and overwrite a buffer of twice the L2 size, so every
    sample starts cold. After the call: a device-wide synchronisation
    (torch.cuda.synchronize) before the output is copied to the host. These
    run in the candidate's process, so they are hygiene, not trust: the
    harness's clock stops only when the output bytes have reached it.
    """

    def __init__(self):
        import ctypes

        import torch
        self.torch = torch
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 << 20
        self.flush_buffer = torch.empty(2 * l2 // 4 + 1, dtype=torch.int32, device="cuda")
        try:
            self.cudart = ctypes.CDLL("libcudart.so")
        except OSError:
            self.cudart = None

    def before(self):
        if self.cudart is not None:
            self.cudart.cudaCtxResetPersistingL2Cache()
        self.flush_buffer.zero_()
        self.torch.cuda.synchronize()

    def after(self, output):
        self.torch.cuda.synchronize()
        if hasattr(output, "detach") and hasattr(output, "cpu"):
            output = output.detach().cpu().numpy()
        return output


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


def serve(entry, conn, gpu=None):
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
        if gpu is not None:
            gpu.before()
        started = time.perf_counter_ns()
        try:
            output = entry(**inputs)
            if gpu is not None:
                output = gpu.after(output)
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


def stdio_channel():
    """Slurm mode: take the step's stdin/stdout as the channel and give the candidate
    /dev/null as stdin and stderr as stdout, so its prints never enter the channel."""
    read_fd, write_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol.PipeChannel(read_fd, write_fd)


def main(argv):
    """Entry point (see the module doc for the two argument forms). Returns the exit status."""
    if argv[1] == "--stdio":
        candidate_path = argv[2]
        conn = stdio_channel()
    else:
        candidate_path, socket_path = argv[1], argv[2]
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(socket_path)
        listener.listen(1)
        conn, _ = listener.accept()
        listener.close()
    try:
        gpu = _Gpu() if GPU else None
        entry = load_candidate(candidate_path)
    except BaseException:
        protocol.send(conn, {"op": "error", "id": None, "error": traceback.format_exc(limit=5)[-2000:]})
        return 3
    protocol.send(conn, {"op": "hello", "pid": os.getpid()})
    serve(entry, conn, gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
