"""One small client interface to Slurm: its commands' JSON output where it exists, else parsed text."""
