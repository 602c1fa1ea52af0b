"""slurmbox: run Slurm job steps inside gVisor (runsc) sandboxes with their
allocated accelerators.

Layers, each importing only those below it: ``cli``; ``step`` (launcher,
supervisor, step broker), ``spank_plugin`` (the C shim, its build, the submit
check); features ``migrate``, ``measure``, ``topology``, ``doctor``,
``dev_cluster``; primitives ``sandbox`` (bundle, devices, options, runsc,
cgroups, framing, cleanup) and ``settings`` (plugstack, site configuration);
``slurm_client`` (the one client of Slurm's commands) and ``atomic_file``."""

__version__ = "0.1.0"
