"""Read Slurm's own topology files into the model: ``topology.conf`` (topology/tree and
topology/block, topology.conf(5)) and ``topology.yaml`` (Slurm >= 25.05, topology.yaml(5)).

topology.conf lines are ``SwitchName=S [Switches=HOSTLIST] [Nodes=HOSTLIST] [LinkSpeed=N]``,
``BlockName=B Nodes=HOSTLIST`` and ``BlockSizes=N,...``; keys are case-insensitive and
``#`` starts a comment. A tree file becomes a :class:`Fabric` with explicit parents (each
switch without a parent is a root: several roots stay several trees); blocks become
NVLink domains named after the block. topology.yaml is a list of ``{topology: NAME,
cluster_default: BOOL, tree|block|flat|ring|torus3d: ...}``; tree and block entries are
read the same way, the other kinds are listed in ``Topology.other``.
"""

import yaml

from .hostlists import expand
from .model import Fabric, FabricNode, Link, Topology, TopologyError


def _tree_fabric(name, switches):
    """``switches``: list of (switch name, [child switches], [hosts])."""
    fabric = Fabric(name, "InfiniBand")
    fabric.parents = {}
    for switch, children, hosts in switches:
        fabric.add_node(FabricNode(switch, "switch"))
    for switch, children, hosts in switches:
        for child in children:
            if child not in fabric.nodes:
                fabric.add_node(FabricNode(child, "switch"))
            if child in fabric.parents and fabric.parents[child] != switch:
                fabric.warnings.append("switch %s listed under %s and %s; kept under %s"
                                       % (child, fabric.parents[child], switch, fabric.parents[child]))
                continue
            fabric.parents[child] = switch
            fabric.add_link(Link(switch, 0, child, 0))
        for host in hosts:
            ident = "host:" + host
            if ident not in fabric.nodes:
                fabric.add_node(FabricNode(ident, "ca", host, 1, host))
            fabric.add_link(Link(switch, 0, ident, 1))
    return fabric


def parse_conf(text, name="topology.conf"):
    """topology.conf ``text`` -> Topology (one Fabric for switches, domains for blocks).

    Raises TopologyError on a line that is neither a switch, a block nor BlockSizes.
    """
    topo = Topology()
    switches = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = {}
        for word in line.split():
            key, sep, value = word.partition("=")
            if not sep:
                raise TopologyError("%s:%d: %r is not Key=Value" % (name, number, word))
            fields[key.lower()] = value
        if "switchname" in fields:
            switches.append((fields["switchname"], expand(fields.get("switches", "")),
                             expand(fields.get("nodes", ""))))
        elif "blockname" in fields:
            for host in expand(fields.get("nodes", "")):
                topo.add_domain_host(host, name=fields["blockname"])
        elif "blocksizes" in fields:
            try:
                topo.block_sizes = [int(v) for v in fields["blocksizes"].split(",") if v]
            except ValueError:
                raise TopologyError("%s:%d: BlockSizes must be integers" % (name, number))
        else:
            raise TopologyError("%s:%d: expected SwitchName=, BlockName= or BlockSizes=" % (name, number))
    if switches:
        topo.fabrics.append(_tree_fabric(name, switches))
    return topo


def parse_yaml(text, name="topology.yaml"):
    """topology.yaml ``text`` -> Topology; TopologyError when it is not a list of topologies."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise TopologyError("%s: not YAML: %s" % (name, err))
    if not isinstance(data, list):
        raise TopologyError("%s: expected a list of topologies (topology.yaml(5))" % name)
    topo = Topology()
    for entry in data:
        if not isinstance(entry, dict) or "topology" not in entry:
            raise TopologyError("%s: each entry needs a 'topology' name" % name)
        label = str(entry["topology"])
        if "tree" in entry:
            switches = [(sw["switch"], expand(sw.get("children", "")), expand(sw.get("nodes", "")))
                        for sw in entry["tree"].get("switches", [])]
            topo.fabrics.append(_tree_fabric(label, switches))
        elif "block" in entry:
            block = entry["block"]
            for item in block.get("blocks", []):
                for host in expand(item.get("nodes", "")):
                    topo.add_domain_host(host, name=item["block"])
            if block.get("block_sizes"):
                topo.block_sizes = [int(v) for v in block["block_sizes"]]
        else:
            kinds = [k for k in entry if k not in ("topology", "cluster_default", "nodes")]
            topo.other.append("%s: %s" % (label, ",".join(kinds)))
    return topo


def read(path):
    """Read a topology.conf or topology.yaml file (by content)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise TopologyError("cannot read %s: %s" % (path, err.strerror))
    stripped = text.lstrip()
    if stripped.startswith("---") or stripped.startswith("- topology"):
        return parse_yaml(text, path)
    return parse_conf(text, path)
