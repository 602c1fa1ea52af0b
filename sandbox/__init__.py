"""Sandboxed job steps: the task launcher, the root-run step supervisor, the
OCI bundle it builds for gVisor (runsc), device mapping and cleanup."""
