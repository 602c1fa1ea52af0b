"""NVLink domain membership and NetQ fabric graphs.

``--fabric-info FILE`` (YAML or JSON) says which hosts share a multi-node NVLink domain.
Accepted layouts:

- slurmbox's own, as ``slurmbox topology show --local --json`` reports a node's NVML
  fabric info: a list of ``{host, cluster_uuid, clique_id}`` or a mapping
  ``{host: {cluster_uuid, clique_id}}`` (``clique_id`` an int; ``cluster_uuid`` text).
- NVIDIA NetQ/NMX compute nodes (``/nmx/v1/compute-nodes``): a list of
  ``{"Name": host, "DomainUUID": uuid, "GpuIDList": [...], ...}``; the DomainUUID
  names the NVLink domain and no clique id is given.

NetQ topology graphs (``topologyGraph`` JSON: ``nodes`` = tiers holding
``compounded_nodes`` with ``device_type`` "switch" or hosts, ``links`` with
``src``/``target`` ids and ``size`` = number of cables) load into an Ethernet
:class:`Fabric` (a RoCE network).
"""

import json

import yaml

from .hostlists import is_host_name
from .model import Fabric, FabricNode, Link, Topology, TopologyError


def _load(text, name):
    try:
        return yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError:
        try:
            return json.loads(text)
        except ValueError as err:
            raise TopologyError("%s: neither YAML nor JSON: %s" % (name, err))


def parse_fabric_info(text, topo=None, name="fabric-info"):
    """Add the NVLink domains in ``text`` to ``topo`` (a new Topology by default); returns it.

    Raises TopologyError when an entry has no host or no domain identity.
    """
    topo = topo or Topology()
    data = _load(text, name)
    if isinstance(data, dict):
        data = [dict(v, host=k) for k, v in data.items()]
    if not isinstance(data, list):
        raise TopologyError("%s: expected a list or mapping of hosts" % name)
    for entry in data:
        if not isinstance(entry, dict):
            raise TopologyError("%s: each entry must be a mapping" % name)
        if "DomainUUID" in entry:
            host, uuid, clique = entry.get("Name"), entry["DomainUUID"], None
        else:
            host, uuid, clique = entry.get("host"), entry.get("cluster_uuid"), entry.get("clique_id")
        if not host or not uuid:
            raise TopologyError("%s: entry %r needs a host (Name) and a cluster_uuid (DomainUUID)" % (name, entry))
        if not is_host_name(str(host)):
            raise TopologyError("%s: host %r is not a plain host name (letters, digits, '_', '.', '-')"
                                % (name, host))
        if clique is not None:
            try:
                clique = int(clique)
            except (TypeError, ValueError):
                raise TopologyError("%s: host %s: clique_id %r is not an integer" % (name, host, clique)) from None
        topo.add_domain_host(str(host), str(uuid), clique,
                             name="%s/%s" % (uuid, clique) if clique is not None else str(uuid))
    return topo


def parse_netq_graph(text, name="netq"):
    """NetQ ``topologyGraph`` JSON -> Fabric (switches, hosts as one-port CAs, links)."""
    data = _load(text, name)
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict) or "nodes" not in data or "links" not in data:
        raise TopologyError("%s: expected a NetQ topology graph with 'nodes' and 'links'" % name)
    try:
        return _netq_fabric(data, name)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise TopologyError("%s: malformed NetQ topology graph (%s: %s); expected nodes with 'id' and links "
                            "with 'src', 'target' and an integer 'size'" % (name, type(err).__name__, err)) from None


def _netq_fabric(data, name):
    fabric = Fabric(name, "Ethernet")
    for tier in data["nodes"]:
        for node in tier.get("compounded_nodes", [tier]):
            ident = str(node["id"])
            label = str(node.get("name", ident))
            if node.get("device_type") == "switch":
                fabric.add_node(FabricNode(ident, "switch", label))
            else:  # the name is the host's own report: only a plain host name is used as one
                if not is_host_name(label):
                    fabric.warnings.append("host %r is not a plain host name; left out of the node lists" % label)
                fabric.add_node(FabricNode(ident, "ca", label, 1, label if is_host_name(label) else None))
    for link in data["links"]:
        a, b = str(link["src"]), str(link["target"])
        if a not in fabric.nodes or b not in fabric.nodes:
            fabric.warnings.append("link %s names an unknown node" % link.get("id"))
            continue
        fabric.add_link(Link(a, 0, b, 0, count=int(link.get("size", 1))))
    return fabric


def looks_like_netq(data):
    """True when parsed JSON ``data`` is a NetQ topology graph."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    return isinstance(data, dict) and "nodes" in data and "links" in data
