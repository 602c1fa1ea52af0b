"""Per-node health checks (slurmbox doctor)."""
