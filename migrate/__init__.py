"""Checkpoint, requeue and restore of sandboxes on preemption and spot reclaim (planned)."""
