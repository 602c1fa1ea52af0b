"""NVLink/NVSwitch/XGMI domains and InfiniBand/RoCE fabrics mapped to Slurm allocations.

Modules, one job each:

- ``model``: switches, CAs, ports, links, tiers and rooted trees; per-node GPUs/NICs and
  their path levels; NVLink domains keyed by (clusterUuid, cliqueId); XGMI hives.
- Readers: ``ibnetdiscover``, ``ibstat`` (and ibv_devinfo), ``nvidia_smi`` (topo -m, -p2p),
  ``amd`` (rocm-smi/amd-smi), ``nccl_xml``, ``slurm_conf`` (topology.conf/yaml),
  ``fabric_info`` (NVLink domains, NetQ graphs), ``override`` (admin file), ``local``
  (NVML, amdsmi, pyverbs, sysfs); ``sources`` detects and loads files.
- Writers and decisions: ``slurm_out`` (topology/tree, topology/block, topology.yaml),
  ``nccl_xml.to_xml`` (NCCL_TOPO_FILE), ``place`` (placements), ``nccl_hints`` (NCCL
  variables), ``sandbox_hints`` (what a sandboxed step gets mounted and set).

The command line is ``slurmbox topology generate|show|place|hints``.
"""
