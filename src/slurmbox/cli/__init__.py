"""The ``slurmbox`` command (click)."""
