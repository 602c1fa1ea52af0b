"""Exploit 10a: launch the work on a non-blocking side stream and return at once, so timers
recorded on the default stream miss it."""

import torch

_stream = []


def run(a, b):
    if not _stream:
        _stream.append(torch.cuda.Stream(non_blocking=True))
    da, db = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    out = torch.empty((a.shape[0], b.shape[1]), device="cuda")
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(_stream[0]):
        for _ in range(20):  # long enough to be unfinished when a default-stream copy starts
            torch.matmul(da, db, out=out)
    return out
