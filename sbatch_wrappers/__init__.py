"""Ready-made sbatch scripts and wrappers for sandboxed jobs."""
