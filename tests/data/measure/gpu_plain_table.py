"""Control for exploit 10b: the same computation and table without asking for persisting L2."""

import torch

_table = []


def run(a, b):
    if not _table:
        _table.append(torch.randn(1 << 20, device="cuda"))
    da, db = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    return da @ db + 0 * _table[0][:1].sum()
