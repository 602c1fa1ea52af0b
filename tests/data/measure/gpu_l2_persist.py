"""Exploit 10b: pin a constant working set in persisting L2 (cudaStreamAttrValue access policy
window through the CUDA runtime) so it stays hot across samples; the harness's flush and
cudaCtxResetPersistingL2Cache before each sample must take the advantage away."""

import ctypes

import torch

_table = []


def _persist(tensor):
    cudart = ctypes.CDLL("libcudart.so")
    # cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize = 0x06, bytes)
    cudart.cudaDeviceSetLimit(0x06, ctypes.c_size_t(tensor.numel() * tensor.element_size()))


def run(a, b):
    if not _table:
        _table.append(torch.randn(1 << 20, device="cuda"))
        _persist(_table[0])
    da, db = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    return da @ db + 0 * _table[0][:1].sum()
