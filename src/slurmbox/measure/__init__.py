"""Trusted measurement of untrusted candidates run in sandboxes (``slurmbox measure``).

Modules, one job each:

- ``campaign``: the Python API (run_campaign) - one task, several candidates, one record file;
- ``harness``: the per-candidate sampling loop and the verdict;
- ``candidate_sandbox``: one runsc sandbox per candidate (and the unsandboxed benchmark baseline);
- ``slurm_step``: Slurm mode, a candidate as a sandboxed ``srun`` step;
- ``runner`` / ``protocol``: the candidate-side glue and the channel framing (copied into the sandbox);
- ``task`` / ``reference``: trusted task files and the separate reference process;
- ``checks``: output verdicts and the named flags; ``stats``: statistics and comparisons;
- ``isolation``: cpusets, CPU weight and cgroup CPU accounting; ``gpu``: NVML;
- ``fingerprint``, ``records`` (HDF5), ``report``, ``policy`` (SitePolicy.measurement).

See measure/README.md for the trust boundary and the exploits each flag catches.
"""
