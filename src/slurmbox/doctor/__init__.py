"""``slurmbox doctor``: check one node before it takes sandboxed jobs.

``report`` (check results and the --json schema), ``hardware`` (the one small
interface over nvidia-ml-py, amdsmi and pyverbs), check groups
``runtime_checks`` (runsc), ``device_checks`` (gres devices, NVML, AMD SMI,
RDMA, GPU clocks), ``node_checks`` (munge, slurmd, cgroups, checkpoint
store, site configuration), and ``run`` which gathers the node's context and
runs them all.
"""
