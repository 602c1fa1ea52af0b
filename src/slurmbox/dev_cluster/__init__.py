"""``slurmbox dev-cluster``: a real multi-node Slurm cluster on one machine."""
