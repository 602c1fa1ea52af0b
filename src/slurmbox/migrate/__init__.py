"""Checkpoint, requeue and restore of sandboxes on preemption, spot reclaim and maintenance."""
