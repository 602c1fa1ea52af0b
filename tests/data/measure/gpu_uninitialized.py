"""Exploit 10c: return uninitialised device memory (torch.empty), hoping it still holds an
earlier correct result; running twice and comparing exposes it."""

import torch


def run(a, b):
    return torch.empty((a.shape[0], b.shape[1]), device="cuda")
