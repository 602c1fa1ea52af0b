"""Load topology sources (files of the formats slurmbox reads) into one :class:`Topology`.

Kinds: ``ibnetdiscover``, ``ibstat`` (or ibv_devinfo), ``nvidia-smi-topo``,
``nvidia-smi-p2p``, ``amd-topo`` (rocm-smi/amd-smi), ``nccl-xml``, ``topology-conf``
(topology.conf or topology.yaml), ``netq`` (NetQ topology graph), ``fabric-info``
(NVLink domains, see fabric_info), ``override`` (admin file, see override).
:func:`detect` guesses the kind from the content.

Per-node sources take an optional host: ``HOST=PATH``; without one the node is called
after the file name.
"""

import json
import os
import re

from . import amd, fabric_info, ibnetdiscover, ibstat, nccl_xml, nvidia_smi, slurm_conf
from .model import Topology, TopologyError

KINDS = ("ibnetdiscover", "ibstat", "nvidia-smi-topo", "nvidia-smi-p2p", "amd-topo", "nccl-xml",
         "topology-conf", "netq", "fabric-info", "override")


def read_text(path):
    """Contents of ``path`` (str); TopologyError when unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError as err:
        raise TopologyError("cannot read %s: %s" % (path, err.strerror or err))


def _ibnetdiscover_head(path):
    """True when the start of file ``path`` is detected as ibnetdiscover output (see detect)."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            head = handle.read(4000)
    except OSError:
        return False  # read_text reports it
    try:
        return detect(head) == "ibnetdiscover"
    except TopologyError:
        return False


def split_host(spec):
    """``"HOST=PATH"`` -> (HOST, PATH); ``"PATH"`` -> (None, PATH)."""
    if "=" in spec and not os.path.exists(spec):
        host, path = spec.split("=", 1)
        if host and "/" not in host:
            return host, path
    return None, spec


def detect(text):
    """Kind of a source from its content (see KINDS); TopologyError when unrecognised."""
    head = text[:4000]
    if re.search(r'^(Switch|Ca)\s+\d+\s+"[SH]-', head, re.M):
        return "ibnetdiscover"
    if re.search(r"^CA '", head, re.M) or re.search(r"^hca_id:", head, re.M):
        return "ibstat"
    if "<system" in head:
        return "nccl-xml"
    if re.search(r"^\s*(SwitchName|BlockName)=", head, re.M | re.I) or re.search(r"^- topology:", head, re.M):
        return "topology-conf"
    if "between two GPUs" in head or "LINK TYPE TABLE:" in head or '"link_type"' in head:
        return "amd-topo"
    if nvidia_smi.looks_like(head):
        return "nvidia-smi-p2p" if re.search(r"^\s*GPU0\s+X\s+(OK|CNS|GNS|TNS|NS|U)\b", head, re.M) \
            else "nvidia-smi-topo"
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if data is not None and fabric_info.looks_like_netq(data):
            return "netq"
        return "fabric-info"
    raise TopologyError("cannot tell what kind of topology source this is; name the kind (e.g. --ibnetdiscover)")


def load(topo, kind, spec):
    """Add the source ``spec`` (``PATH`` or ``HOST=PATH``) of ``kind`` to ``topo``; returns topo.

    A kind of None is detected from the content. Raises TopologyError on bad input.
    """
    host, path = split_host(spec)
    if kind is None and _ibnetdiscover_head(path):
        kind = "ibnetdiscover"
    if kind == "ibnetdiscover" and os.path.isfile(path):
        topo.fabrics.append(ibnetdiscover.read(path))  # read as it goes: a large fabric is never held whole
        return topo
    text = read_text(path)
    kind = kind or detect(text)
    node_name = host or os.path.basename(path)
    if kind == "ibnetdiscover":
        topo.fabrics.append(ibnetdiscover.parse(text, path))
    elif kind == "ibstat":
        nics = ibstat.parse(text)
        node = topo.nodes.setdefault(node_name, _new_node(node_name))
        merge_nics(node, nics)
        if host:
            mapping = ibstat.guid_map(nics, host)
            for fabric in topo.fabrics:
                fabric.map_guids(mapping)
            topo.guid_maps.update(mapping)
    elif kind in ("nvidia-smi-topo", "amd-topo", "nccl-xml"):
        if kind == "nvidia-smi-topo":
            parsed = nvidia_smi.parse_topo_matrix(text, node_name)
        elif kind == "amd-topo":
            parsed = amd.parse(text)
        else:
            parsed = nccl_xml.parse(text, node_name)
        parsed.host = node_name
        existing = topo.nodes.get(node_name)
        if existing is not None and existing.nics:
            merge_nics(parsed, existing.nics)
        topo.nodes[node_name] = parsed
    elif kind == "nvidia-smi-p2p":
        topo.nodes[node_name] = nvidia_smi.parse_p2p(text, topo.nodes.get(node_name), node_name)
    elif kind == "topology-conf":
        loaded = slurm_conf.parse_yaml(text, path) if re.match(r"\s*(---|- topology)", text) \
            else slurm_conf.parse_conf(text, path)
        topo.fabrics.extend(loaded.fabrics)
        for key, domain in loaded.domains.items():
            for h in domain.hosts:
                topo.add_domain_host(h, domain.cluster_uuid, domain.clique_id, domain.name)
        topo.block_sizes = loaded.block_sizes or topo.block_sizes
        topo.other.extend(loaded.other)
    elif kind == "netq":
        topo.fabrics.append(fabric_info.parse_netq_graph(text, path))
    elif kind == "fabric-info":
        fabric_info.parse_fabric_info(text, topo, path)
    elif kind == "override":
        from . import override
        override.apply(topo, override.parse(text, path))
    else:
        raise TopologyError("unknown source kind %r (one of %s)" % (kind, ", ".join(KINDS)))
    # GUID maps given before an ibnetdiscover file still apply to it.
    if kind == "ibnetdiscover" and topo.guid_maps:
        topo.fabrics[-1].map_guids(topo.guid_maps)
    return topo


def merge_nics(node, nics):
    """Merge HCA details (ports, GUIDs: from ibstat/pyverbs) into ``node``'s NICs of the same
    name; NICs ``node`` does not list yet are appended."""
    by_name = {n.name: n for n in node.nics}
    for nic in nics:
        mine = by_name.get(nic.name)
        if mine is None:
            node.nics.append(nic)
            continue
        mine.ports = nic.ports or mine.ports
        mine.node_guid = nic.node_guid if nic.node_guid is not None else mine.node_guid
        mine.ca_type = nic.ca_type or mine.ca_type
        mine.netdev = nic.netdev or mine.netdev
        mine.busid = mine.busid or nic.busid


def _new_node(host):
    from .model import NodeTopology
    return NodeTopology(host)


def load_all(pairs):
    """[(kind or None, spec)] -> Topology, in the given order."""
    topo = Topology()
    for kind, spec in pairs:
        load(topo, kind, spec)
    return topo
