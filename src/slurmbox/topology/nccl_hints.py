"""NCCL/RCCL environment hints for a step, from the node's topology.

Variables (NCCL "Environment Variables" documentation; RCCL reads the same names):

- ``NCCL_IB_HCA``: ``=name:port,...`` -- the ``=`` prefix makes NCCL match the names
  exactly (``mlx5_1`` would otherwise also select ``mlx5_10``); the NICs nearest each of
  the step's GPUs, active RDMA ports only.
- ``NCCL_SOCKET_IFNAME``: ``=ifname,...`` of those NICs' network interfaces when known
  (bootstrap traffic); left unset otherwise (NCCL's default already skips lo and docker).
- ``NCCL_IB_GID_INDEX``: for RoCE (Ethernet link layer) ports, the RoCE v2 GID index with
  an IPv4-mapped address.
- ``NCCL_CROSS_NIC=0``: when the chosen NICs sit on different InfiniBand subnets (different
  SM LIDs: separate rails), a ring must not cross from one NIC to another.
- ``NCCL_MNNVL_ENABLE=1``: when the step's nodes all belong to one multi-node NVLink domain
  ((clusterUuid, cliqueId) equal); ``0`` when they span several.
- ``NCCL_TOPO_FILE``: the node's NCCL topology XML (see :mod:`sandbox_hints`).
"""

from .model import TopologyError


def _active_rdma_ports(nic):
    ports = [p for p in nic.ports if p.state in (None, "Active") and p.link_layer in (None, "InfiniBand", "Ethernet")]
    return ports or ([] if nic.ports else [None])


def step_hints(node, gpus=None, step_hosts=None, domain_of=None):
    """{variable: value} for a step on ``node`` (NodeTopology) using GPU indices ``gpus``
    (default: all GPUs); ``step_hosts``: the step's hosts and ``domain_of``: {host:
    NVLinkDomain} for NCCL_MNNVL_ENABLE. Raises TopologyError for an unknown GPU index."""
    env = {}
    chosen_gpus = node.gpus if gpus is None else []
    if gpus is not None:
        by_index = {g.index: g for g in node.gpus}
        for index in gpus:
            if index not in by_index:
                raise TopologyError("GPU %s is not in this node's topology (GPUs: %s)"
                                    % (index, ", ".join(str(i) for i in sorted(by_index)) or "none"))
            chosen_gpus.append(by_index[index])
    nic_names = []
    for gpu in chosen_gpus:
        for name in node.nearest_nics(gpu.name):
            if name not in nic_names:
                nic_names.append(name)
    if not nic_names and not node.gpu_nic:
        nic_names = [n.name for n in node.nics]
    nics = [n for n in node.nics if n.name in nic_names]
    entries, netdevs, gid_indices, subnets = [], [], set(), set()
    for nic in nics:
        for port in _active_rdma_ports(nic):
            entries.append(nic.name if port is None else "%s:%d" % (nic.name, port.number))
            if port is not None and port.link_layer == "Ethernet":
                index = port.roce_v2_gid_index()
                if index is not None:
                    gid_indices.add(index)
            if port is not None and port.link_layer == "InfiniBand" and port.sm_lid:
                subnets.add(port.sm_lid)
        if nic.netdev:
            netdevs.append(nic.netdev)
    if entries:
        env["NCCL_IB_HCA"] = "=" + ",".join(entries)
    if netdevs:
        env["NCCL_SOCKET_IFNAME"] = "=" + ",".join(netdevs)
    if len(gid_indices) == 1:
        env["NCCL_IB_GID_INDEX"] = str(gid_indices.pop())
    if len(subnets) > 1:
        env["NCCL_CROSS_NIC"] = "0"
    if step_hosts and domain_of is not None and len(step_hosts) > 1:
        keys = {domain_of[h].key if h in domain_of else None for h in step_hosts}
        if len(keys) == 1 and None not in keys:
            env["NCCL_MNNVL_ENABLE"] = "1"
        elif any(k is not None for k in keys):
            env["NCCL_MNNVL_ENABLE"] = "0"
    return env
