"""Trusted measurement of untrusted candidates run in sandboxes (slurmbox measure)."""
