"""Step processes: the task launcher, the root-run step supervisor and the step broker (the top layer of a sandboxed step)."""
