"""slurmbox: run Slurm job steps inside gVisor (runsc) sandboxes with their
allocated accelerators. Subpackages: ``sandbox`` (launcher, supervisor, OCI
bundle), ``spank_plugin`` (the C shim and its build), ``cli`` (the
``slurmbox`` command), ``dev_cluster`` (a local Slurm cluster), ``site_config``,
``topology``, ``migrate``, ``sbatch_wrappers``."""

__version__ = "0.1.0"
