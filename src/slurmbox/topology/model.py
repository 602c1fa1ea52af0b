"""The topology model: fabrics (switches, channel adapters, ports, links), hosts, per-node
GPU/NIC topology, NVLink domains, XGMI hives and Slurm blocks.

Terms follow the field's usage:

- A *fabric* is one physically connected network (an InfiniBand subnet as seen by one
  ``ibnetdiscover`` run, or an Ethernet/RoCE network). Nodes of a fabric are switches and
  channel adapters (CAs: HCAs/NICs); links join (node, port) pairs and carry a width
  (``4x``) and a speed (``EDR``), as ``ibnetdiscover(8)`` prints them.
- A fabric's switches are arranged in *tiers*: a *leaf switch* (tier 1) has a host's CA
  cabled to it; tier n+1 switches are one hop above the nearest tier-n switch. Each
  connected part of a fabric gets exactly one root; unconnected parts are never joined
  under a made-up root (Slurm then never places one job across them, which is right).
- An *NVLink domain* is keyed by ``(cluster_uuid, clique_id)`` from NVML's GPU fabric info
  (``nvmlDeviceGetGpuFabricInfo``); clique ids alone repeat across racks.
- An *XGMI hive* is a set of AMD GPUs joined by XGMI links.
- Per node, GPU<->GPU and GPU<->NIC paths use ``nvidia-smi topo -m``'s levels, nearest
  first: ``NV#`` (NVLink, # bonded links), ``XGMI``, ``PIX`` (at most one PCIe bridge),
  ``PXB`` (several bridges, no host bridge), ``PHB`` (a PCIe host bridge), ``NODE``
  (between host bridges of one NUMA node), ``SYS`` (across NUMA nodes: QPI/UPI/xGMI).
"""

import contextlib
import gc
import re
from collections import deque
from itertools import groupby
from operator import attrgetter, itemgetter

# Per-lane data rate in Gb/s as ibstat(8) reports "Rate" (4x EDR -> 100). Source:
# infiniband-diags ibstat/ibnetdiscover speed names; IBTA Vol. 2 link speeds.
LANE_GBPS = {"SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0,
             "HDR": 50.0, "NDR": 100.0, "XDR": 200.0}

# PCIe/interconnect path levels, nearest first (nvidia-smi topo -m legend).
PCI_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_NV_RE = re.compile(r"^NV(\d+)$")
_NUMBERS = re.compile(r"(\d+)")


@contextlib.contextmanager
def no_gc():
    """Pause the cyclic garbage collector while building many objects at once (a large
    fabric makes ~100,000; the collector would rescan them repeatedly). The objects hold
    no reference cycles; the previous state is restored."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def natural_key(name):
    """Sort key that orders embedded numbers by value ("s9" before "s10")."""
    key = [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in _NUMBERS.split(name)]
    key.append((2, 0, name))  # "n1" and "n01" tie on numbers: the text decides, so order is total
    return key


class TopologyError(ValueError):
    """Input that cannot be turned into a topology; ``str()`` says what and what to do."""


def level_rank(kind):
    """Sort key of a path level (lower is nearer): NV# (more links nearer), XGMI, PIX ... SYS.

    Raises TopologyError for an unknown level name.
    """
    match = _NV_RE.match(kind)
    if match:
        return (0, -int(match.group(1)))
    if kind in ("XGMI", "NVB"):
        return (1, 0)
    if kind in PCI_LEVELS:
        return (2 + PCI_LEVELS.index(kind), 0)
    raise TopologyError("unknown path level %r (expected NV#, XGMI, %s)" % (kind, ", ".join(PCI_LEVELS)))


class FabricNode:
    """A switch, channel adapter or router of a fabric.

    ``ident``: unique id within the fabric (``S-<guid>``/``H-<guid>`` for InfiniBand, the
    switch name for a Slurm file); ``kind``: "switch", "ca" or "router"; ``ports``: port
    count; ``host``: the host a CA belongs to (None when unknown); ``lid``: base LID.
    """

    __slots__ = ("ident", "kind", "description", "ports", "host", "lid", "guid")

    def __init__(self, ident, kind, description="", ports=0, host=None, lid=None, guid=None):
        self.ident = ident
        self.kind = kind
        self.description = description
        self.ports = ports
        self.host = host
        self.lid = lid
        self.guid = guid

    def as_dict(self):
        """JSON-ready dict."""
        return {"id": self.ident, "kind": self.kind, "description": self.description, "ports": self.ports,
                "host": self.host, "lid": self.lid, "guid": self.guid}


class Link:
    """A cable between (``a``, ``a_port``) and (``b``, ``b_port``) (node idents, port numbers).

    ``width``: lanes as printed (``"4x"``), ``speed``: lane speed name (``"EDR"``); both None
    when the source does not say. ``count``: parallel cables this link stands for (NetQ
    "compounded" links).
    """

    __slots__ = ("a", "a_port", "b", "b_port", "width", "speed", "count")

    def __init__(self, a, a_port, b, b_port, width=None, speed=None, count=1):
        self.a, self.a_port, self.b, self.b_port = a, a_port, b, b_port
        self.width, self.speed, self.count = width, speed, count

    @property
    def loopback(self):
        """True for a cable from a switch back to itself."""
        return self.a == self.b

    @property
    def rate_gbps(self):
        """Data rate in Gb/s (lanes x per-lane rate, ibstat's "Rate"), or None when unknown."""
        if not self.width or self.speed not in LANE_GBPS:
            return None
        return int(self.width.rstrip("x")) * LANE_GBPS[self.speed]

    def as_dict(self):
        """JSON-ready dict."""
        return {"a": self.a, "a_port": self.a_port, "b": self.b, "b_port": self.b_port, "width": self.width,
                "speed": self.speed, "rate_gbps": self.rate_gbps, "count": self.count}


_ROW_A, _ROW_B = itemgetter(0), itemgetter(2)
_LINK_A, _LINK_B = attrgetter("a"), attrgetter("b")


class SwitchTree:
    """One rooted tree of switches for Slurm's topology/tree, from one connected fabric part.

    ``root``: switch ident; ``children``: ident -> sorted child switch idents;
    ``hosts``: leaf switch ident -> sorted host names; ``tier``: ident -> tier (leaf = 1).
    """

    def __init__(self, root, children, hosts, tier):
        self.root, self.children, self.hosts, self.tier = root, children, hosts, tier

    def switches(self):
        """Switch idents of the tree, root first, breadth-first, children in order."""
        order, queue = [], deque([self.root])
        while queue:
            ident = queue.popleft()
            order.append(ident)
            queue.extend(self.children.get(ident, ()))
        return order

    def all_hosts(self, ident=None):
        """Sorted host names below switch ``ident`` (default: the root)."""
        found, stack = [], [ident or self.root]
        while stack:
            sw = stack.pop()
            found.extend(self.hosts.get(sw, ()))
            stack.extend(self.children.get(sw, ()))
        return sorted(found)

    def leaf_of(self):
        """Host name -> its leaf switch ident."""
        return {h: sw for sw, hosts in self.hosts.items() for h in hosts}

    def path_to_root(self):
        """Switch ident -> list of idents from it up to the root (inclusive)."""
        parent = {c: p for p, cs in self.children.items() for c in cs}
        paths = {}
        for sw in self.switches():
            paths[sw] = [sw] + (paths[parent[sw]] if sw in parent else [])
        return paths


class Fabric:
    """One network: nodes (switches, CAs) and links, as one source saw it.

    ``name``: a label (the source file); ``link_layer``: "InfiniBand" or "Ethernet" (RoCE).
    ``parents``: explicit switch -> parent switch map when the source is itself a tree
    (a Slurm topology.conf), else None and the tree is derived from the links.
    ``warnings``: lines or facts skipped while reading (stderr noise, SHARP nodes...).
    """

    def __init__(self, name="", link_layer="InfiniBand"):
        self.name = name
        self.link_layer = link_layer
        self._nodes = {}
        self._node_rows = None  # {ident: row} while FabricNode objects are not built (set_node_rows)
        self._build_node = None
        self._switch_nodes = {}  # switches built on their own before all nodes were (switches())
        self._row_views = None  # (switch idents, {CA ident: host}) of the rows, once computed
        # The links come from one of: Link objects (_links), rows (_link_rows, set_link_rows),
        # or, deferred (set_deferred_links), each node's neighbour sightings and CA uplinks
        # with the function that reads the rows and warnings (_load_links). See _set_links.
        self._set_links(links=[])
        self._warnings = []
        self.parents = None

    # -- deferred objects ----------------------------------------------------------------
    # A parser of a large fabric (ibnetdiscover) gives nodes and links as compact rows;
    # FabricNode and Link objects are made from them only when ``nodes``/``links`` is first
    # read. Writing Slurm's topology/tree needs only node kinds, CA hosts and the link ends,
    # which the views below read straight from the rows: on a 16,384-host fat tree this
    # makes only its 1,280 switch nodes, not its 16,384 CA nodes nor its 49,152 link objects
    # (benchmarks/topology_fat_tree.py).

    @property
    def nodes(self):
        """Node ident -> FabricNode (dict, in source order); built on first use when a
        parser gave rows (:meth:`set_node_rows`). Once built, the objects are the model."""
        if self._node_rows is not None:
            rows, build, built = self._node_rows, self._build_node, self._switch_nodes
            with no_gc():
                self._nodes = {ident: built[ident] if ident in built else build(ident, row)
                               for ident, row in rows.items()}
            self._node_rows = self._build_node = self._row_views = None
            self._switch_nodes = {}
        return self._nodes

    @nodes.setter
    def nodes(self, nodes):
        self._nodes = nodes
        self._node_rows = self._build_node = self._row_views = None
        self._switch_nodes = {}

    def set_node_rows(self, rows, build):
        """Set the nodes as rows: ``rows`` is ``{ident: row}`` in source order, each row a
        tuple whose first two items are the node's ``kind`` and ``host`` (None when
        unknown); ``build(ident, row)`` makes the row's FabricNode. Views that need only
        kinds and hosts (:meth:`hosts`, :meth:`trees`, :meth:`tiers`) read the rows;
        :meth:`switches` builds the switch nodes alone; anything else builds all nodes."""
        self._nodes = None
        self._node_rows = rows
        self._build_node = build
        self._switch_nodes = {}
        self._row_views = None

    def _switches_and_hosts(self):
        """(switch idents in node order, {CA ident: host} for CAs whose host is known).

        From the rows while there are (computed once: rows do not change), else from the
        node objects (which callers may have changed since the last call)."""
        if self._node_rows is not None:
            if self._row_views is None:
                rows = self._node_rows
                self._row_views = ([ident for ident, row in rows.items() if row[0] == "switch"],
                                   {ident: row[1] for ident, row in rows.items() if row[0] == "ca" and row[1]})
            return self._row_views
        nodes = self._nodes
        return ([ident for ident, node in nodes.items() if node.kind == "switch"],
                {ident: node.host for ident, node in nodes.items() if node.kind == "ca" and node.host})

    @property
    def links(self):
        """The fabric's Link objects (list); built on first use when a parser gave rows
        (:meth:`set_link_rows`) or deferred them (:meth:`set_deferred_links`)."""
        if self._load_links is not None:
            self._materialize_links()
        if self._link_rows is not None:
            with no_gc():
                self._set_links(links=[Link(a, a_port, b, b_port, width, speed)
                                       for a, a_port, b, b_port, (width, speed) in self._link_rows])
        return self._links

    @links.setter
    def links(self, links):
        self._set_links(links=links)

    def _set_links(self, links=None, rows=None, sightings=None, uplinks=(), load=None):
        """Make the given form the links' only source (see __init__); the others are dropped."""
        self._links, self._link_rows = links, rows
        self._sightings, self._uplinks, self._load_links = sightings, uplinks, load

    @property
    def warnings(self):
        """Lines or facts skipped while reading (list of str); reading it reads deferred
        links first (:meth:`set_deferred_links`), whose reading finds most of them."""
        if self._load_links is not None:
            self._materialize_links()
        return self._warnings

    @warnings.setter
    def warnings(self, warnings):
        self._warnings = warnings

    def set_deferred_links(self, sightings, load, uplinks=()):
        """Defer the links until :attr:`links` or :attr:`warnings` is read.

        ``sightings``: list of ``(ident, far idents)``, the nodes each node's source
        section says it is cabled to, and ``uplinks``: ``(CA idents, far idents)``, two
        parallel lists for CAs cabled once (between them every link named at least once,
        from either end): all that :meth:`trees` and :meth:`tiers` need. ``load()`` returns ``(rows,
        warnings)``, the link rows as :meth:`set_link_rows` takes them and the reader's
        warnings (list of str, added to :attr:`warnings`). A parser of a large fabric uses
        this when reading ports and speeds costs more than finding who is cabled to whom.
        """
        self._set_links(sightings=sightings, uplinks=uplinks, load=load)

    def _materialize_links(self):
        with no_gc():
            rows, warnings = self._load_links()  # may raise: the deferred state stays as it was
        self._set_links(rows=rows)
        self._warnings.extend(warnings)

    def set_link_rows(self, rows):
        """Set the links as rows ``(a, a_port, b, b_port, (width, speed))`` (Link's
        arguments, the last two paired); Link objects are made from them only when
        :attr:`links` is read, so a large fabric whose links are only walked (trees, tiers)
        never builds them."""
        self._set_links(rows=rows)

    # -- building -------------------------------------------------------------------
    def add_node(self, node):
        """Add or replace ``node`` (FabricNode); returns it."""
        self.nodes[node.ident] = node
        return node

    def add_link(self, link):
        """Append ``link`` (Link)."""
        self.links.append(link)

    def map_guids(self, guid_to_host):
        """Give CAs without a host the host of their GUID (``{guid: host}``, GUIDs as ints).

        Used for HCAs whose node description names no host; the map comes from each
        node's ``ibstat``/pyverbs data. Returns the number of CAs mapped.
        """
        mapped = 0
        if not guid_to_host:  # nothing to map: the nodes need not be built
            return mapped
        for node in self.nodes.values():
            if node.kind == "ca" and node.host is None and node.guid is not None and node.guid in guid_to_host:
                node.host = guid_to_host[node.guid]
                mapped += 1
        return mapped

    # -- views ----------------------------------------------------------------------
    def switches(self):
        """Switch nodes, sorted by ident. While the nodes are rows, only the switches are
        built (and kept, so that later reads, :attr:`nodes` included, give the same objects)."""
        if self._node_rows is not None:
            rows, built = self._node_rows, self._switch_nodes
            idents = sorted(self._switches_and_hosts()[0])
            for ident in idents:
                if ident not in built:
                    built[ident] = self._build_node(ident, rows[ident])
            return [built[ident] for ident in idents]
        return sorted((n for n in self._nodes.values() if n.kind == "switch"), key=lambda n: n.ident)

    def cas(self):
        """Channel adapter nodes, sorted by ident."""
        return sorted((n for n in self.nodes.values() if n.kind == "ca"), key=lambda n: n.ident)

    def hosts(self):
        """Host name -> sorted idents of its CAs."""
        hosts = {}
        for ident, host in self._switches_and_hosts()[1].items():
            hosts.setdefault(host, []).append(ident)
        return {h: sorted(v) for h, v in sorted(hosts.items())}

    def unmapped_cas(self):
        """CAs whose host is unknown (no hostname in the description, GUID not mapped)."""
        return [n for n in self.cas() if not n.host]

    def _adjacency(self):
        """(switch -> set of neighbour switches, switch -> set of hosts cabled to it)."""
        switches, ca_host = self._switches_and_hosts()
        sw_adj = {ident: set() for ident in switches}
        host_adj = {}
        sw_set, ca_set = set(sw_adj), set(ca_host)  # set & set walks the smaller side
        # Links come grouped by their first end (a parser's node sections): each group is
        # sorted into switches and CAs with set operations rather than link by link.
        if self._sightings is not None:
            groups = self._sightings
        else:
            if self._link_rows is not None:
                links, first, second = self._link_rows, _ROW_A, _ROW_B
            else:
                links, first, second = self._links, _LINK_A, _LINK_B
            groups = ((a, set(map(second, group))) for a, group in groupby(links, first))
        named_by = {}  # switch -> the CAs its group names
        for a, far in groups:
            near = sw_adj.get(a)
            if near is not None:
                switches = sw_set.intersection(far)
                switches.discard(a)  # a cable back to the same switch
                near |= switches
                cas = ca_set.intersection(far)
                if cas:
                    named_by[a] = cas
                    hosts = set(map(ca_host.__getitem__, cas))
                    known = host_adj.get(a)
                    if known is None:
                        host_adj[a] = hosts
                    else:
                        known |= hosts
            else:
                host = ca_host.get(a)
                if host is not None:
                    for b in far:
                        if b not in sw_set:
                            continue
                        known = host_adj.get(b)
                        if known is None:
                            host_adj[b] = {host}
                        else:
                            known.add(host)
        # A cable named from one end only counts for both.
        one_sided = False
        for a, near in sw_adj.items():
            for b in near:
                other = sw_adj[b]
                if a not in other:
                    other.add(a)
                    one_sided = True
        if self._sightings is not None:
            # Sightings stand for links only when both ends of every cable name each other
            # (every ibnetdiscover run): each CA cabled once names a switch that names it.
            # Otherwise (files pieced together, a fabric recabled between queries) the
            # line-by-line reader's rule decides which cables count: read the links.
            cas, far = self._uplinks or ((), ())
            empty = frozenset()
            for ca, sw in zip(cas, far):
                if ca not in named_by.get(sw, empty) and sw in sw_set:
                    one_sided = True
                    break
            if one_sided:
                self._materialize_links()
                return self._adjacency()
        return sw_adj, host_adj

    def tiers(self):
        """Switch ident -> tier: 1 for leaf switches (a host cabled to it), n+1 one hop above
        the nearest tier-n switch; switches with no path to a host are left out."""
        sw_adj, host_adj = self._adjacency()
        return _tiers(sw_adj, host_adj)

    def trees(self):
        """One SwitchTree per connected part of the fabric that reaches a host.

        The root is a switch of the highest tier (most neighbours, then smallest ident);
        every other switch hangs under the switch that reaches it first in a breadth-first
        walk from the root, visiting lower tiers first and idents in order, so the result
        is deterministic. Switches with no host below them are dropped. A host with
        several CAs is listed under the first leaf (by ident) only.
        """
        sw_adj, host_adj = self._adjacency()
        if self.parents is not None:
            return _explicit_trees(self.parents, sw_adj, host_adj)
        tier = _tiers(sw_adj, host_adj)
        trees, seen = [], set()
        ordered = sorted(tier, key=lambda s: (-tier[s], -len(sw_adj[s]), s))
        # Lower tiers first, then idents: one precomputed rank instead of a key per visit.
        rank = {sw: i for i, sw in enumerate(sorted(sw_adj, key=lambda s: (tier.get(s, 0), s)))}
        for start in ordered:
            if start in seen:
                continue
            # The component of ``start`` (start has the highest tier of its component).
            children = {}
            seen.add(start)
            queue = deque([start])
            order = []
            while queue:
                sw = queue.popleft()
                order.append(sw)
                kids = sw_adj[sw].difference(seen)
                if kids:
                    kids = sorted(kids, key=rank.__getitem__)
                    seen.update(kids)
                    children[sw] = kids
                    queue.extend(kids)
            trees.append(_prune_tree(start, children, host_adj, tier, order))
        trees = [t for t in trees if t is not None]
        _dedupe_hosts(trees)
        return sorted(trees, key=lambda t: t.root)

    def as_dict(self):
        """JSON-ready dict."""
        return {"name": self.name, "link_layer": self.link_layer,
                "nodes": [n.as_dict() for n in sorted(self.nodes.values(), key=lambda n: n.ident)],
                "links": [lk.as_dict() for lk in self.links], "warnings": list(self.warnings)}


def _tiers(sw_adj, host_adj):
    tier = {}
    queue = deque()
    for sw in sorted(host_adj):
        if sw in sw_adj:
            tier[sw] = 1
            queue.append(sw)
    while queue:
        sw = queue.popleft()
        up = tier[sw] + 1
        for nb in sw_adj[sw].difference(tier):
            tier[nb] = up
            queue.append(nb)
    return tier


def _prune_tree(root, children, host_adj, tier, order):
    """Drop switches with no host below; returns a SwitchTree or None when no host at all."""
    has_hosts = {}
    for sw in reversed(order):
        kids = [c for c in children.get(sw, ()) if has_hosts.get(c)]
        if kids:
            children[sw] = sorted(kids, key=natural_key)
        else:
            children.pop(sw, None)
        has_hosts[sw] = bool(kids) or bool(host_adj.get(sw))
    if not has_hosts.get(root):
        return None
    kept = set()
    stack = [root]
    while stack:
        sw = stack.pop()
        kept.add(sw)
        stack.extend(children.get(sw, ()))
    hosts = {sw: sorted(host_adj[sw]) for sw in kept if host_adj.get(sw)}
    return SwitchTree(root, {k: v for k, v in children.items() if k in kept}, hosts,
                      {sw: tier.get(sw, 0) for sw in kept})


def _explicit_trees(parents, sw_adj, host_adj):
    children = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    roots = sorted(sw for sw in sw_adj if sw not in parents)
    trees = []
    for root in roots:
        order, stack = [], [root]
        while stack:
            sw = stack.pop()
            order.append(sw)
            stack.extend(children.get(sw, ()))
        depth_tier = {}
        for sw in reversed(order):
            kids = children.get(sw, ())
            depth_tier[sw] = 1 + max((depth_tier[k] for k in kids), default=0)
        tree = _prune_tree(root, {k: list(v) for k, v in children.items()}, host_adj, depth_tier, order)
        if tree is not None:
            trees.append(tree)
    _dedupe_hosts(trees)
    return sorted(trees, key=lambda t: t.root)


def _dedupe_hosts(trees):
    placed = set()
    for tree in trees:
        for sw in sorted(tree.hosts):
            hosts = tree.hosts[sw]
            if hosts and placed.isdisjoint(hosts):  # the usual case: nothing to drop
                placed.update(hosts)
                continue
            kept = [h for h in tree.hosts[sw] if h not in placed]
            placed.update(kept)
            if kept:
                tree.hosts[sw] = kept
            else:
                del tree.hosts[sw]


class Gpu:
    """A GPU of a node: ``index`` (0-based as the vendor tool numbers it), ``name``
    ("GPU0"), ``busid`` (PCI ``dddd:bb:dd.f``, lower case) or None, ``numa`` node or None,
    ``cpu_affinity`` text or None, ``vendor`` ("nvidia" or "amd")."""

    __slots__ = ("index", "name", "busid", "numa", "cpu_affinity", "vendor", "uuid")

    def __init__(self, index, name=None, busid=None, numa=None, cpu_affinity=None, vendor="nvidia", uuid=None):
        self.index = index
        self.name = name or "GPU%d" % index
        self.busid = busid.lower() if busid else None
        self.numa, self.cpu_affinity, self.vendor, self.uuid = numa, cpu_affinity, vendor, uuid

    def as_dict(self):
        """JSON-ready dict."""
        return {"index": self.index, "name": self.name, "busid": self.busid, "numa": self.numa,
                "cpu_affinity": self.cpu_affinity, "vendor": self.vendor, "uuid": self.uuid}


class NicPort:
    """One port of a NIC/HCA: ``number`` (1-based), ``state`` ("Active", "Down", ...),
    ``link_layer`` ("InfiniBand" or "Ethernet"), ``rate_gbps``, ``lid``, ``sm_lid``,
    ``port_guid`` (int), ``gids``: list of (index, gid text, type) with type "IB",
    "RoCE v1" or "RoCE v2"."""

    __slots__ = ("number", "state", "link_layer", "rate_gbps", "lid", "sm_lid", "port_guid", "gids")

    def __init__(self, number, state=None, link_layer=None, rate_gbps=None, lid=None, sm_lid=None,
                 port_guid=None, gids=None):
        self.number, self.state, self.link_layer, self.rate_gbps = number, state, link_layer, rate_gbps
        self.lid, self.sm_lid, self.port_guid, self.gids = lid, sm_lid, port_guid, list(gids or [])

    def roce_v2_gid_index(self):
        """Lowest GID index of type RoCE v2 whose GID is IPv4-mapped (``::ffff:a.b.c.d``),
        else the lowest RoCE v2 index, else None. (NCCL_IB_GID_INDEX; NCCL docs.)"""
        v2 = [(i, g) for i, g, t in self.gids if t == "RoCE v2"]
        mapped = [i for i, g in v2 if g.lower().startswith("0000:0000:0000:0000:0000:ffff:")
                  or g.lower().startswith("::ffff:")]
        if mapped:
            return min(mapped)
        return min(i for i, _ in v2) if v2 else None

    def as_dict(self):
        """JSON-ready dict."""
        return {"number": self.number, "state": self.state, "link_layer": self.link_layer,
                "rate_gbps": self.rate_gbps, "lid": self.lid, "sm_lid": self.sm_lid,
                "port_guid": "0x%016x" % self.port_guid if self.port_guid is not None else None,
                "gids": [list(g) for g in self.gids]}


class Nic:
    """A NIC/HCA of a node: ``name`` (the verbs device name, ``mlx5_0``; "NIC0" when the
    source gives none), ``busid``, ``node_guid`` (int), ``ports`` (list of NicPort),
    ``netdev`` (Linux interface name) or None, ``ca_type`` ("MT4119"), ``speed_mbps`` (NCCL
    XML ``speed``), ``numa`` (NUMA node of its PCI device) or None."""

    __slots__ = ("name", "busid", "node_guid", "ports", "netdev", "ca_type", "speed_mbps", "numa")

    def __init__(self, name, busid=None, node_guid=None, ports=None, netdev=None, ca_type=None, speed_mbps=None,
                 numa=None):
        self.name = name
        self.busid = busid.lower() if busid else None
        self.node_guid, self.ports, self.netdev, self.ca_type = node_guid, list(ports or []), netdev, ca_type
        self.speed_mbps = speed_mbps
        self.numa = numa

    @property
    def link_layer(self):
        """Link layer of the first port ("InfiniBand", "Ethernet" = RoCE) or None."""
        return self.ports[0].link_layer if self.ports else None

    def as_dict(self):
        """JSON-ready dict."""
        return {"name": self.name, "busid": self.busid,
                "node_guid": "0x%016x" % self.node_guid if self.node_guid is not None else None,
                "netdev": self.netdev, "ca_type": self.ca_type, "link_layer": self.link_layer,
                "speed_mbps": self.speed_mbps, "numa": self.numa, "ports": [p.as_dict() for p in self.ports]}


class PciNode:
    """A node of the PCI tree as NCCL's topology XML describes it: ``busid``, ``klass``
    (PCI class, "0x060400" for a bridge), attributes (dict of the XML attributes) and
    children (PciNode list). ``device``: the Gpu or Nic at this address, if any."""

    __slots__ = ("busid", "klass", "attrs", "children", "device", "extra")

    def __init__(self, busid, klass, attrs=None, children=None, device=None, extra=None):
        self.busid, self.klass = busid.lower(), klass
        self.attrs, self.children = dict(attrs or {}), list(children or [])
        self.device, self.extra = device, extra


class NodeTopology:
    """One host's accelerators and NICs and the paths between them.

    ``gpu_links``: {(gpu name, gpu name): level} with the two names sorted, levels as in
    :func:`level_rank` (e.g. "NV12", "XGMI", "PIX", "SYS"); ``gpu_nic``: {(gpu name, nic
    name): level}; ``gpu_weights``: AMD link weights {(a, b): int}; ``p2p``: {(a, b):
    status} from ``nvidia-smi topo -p2p``; ``cpus``: [(numa id, affinity text, attrs)]
    with ``pci_roots``: {numa id: [PciNode]} when the source is an NCCL XML; ``fabric``:
    {gpu name: (cluster_uuid, clique_id)} from NVML.
    """

    def __init__(self, host=None):
        self.host = host
        self.gpus = []
        self.nics = []
        self.gpu_links = {}
        self.gpu_nic = {}
        self.gpu_weights = {}
        self.p2p = {}
        self.cpus = []
        self.pci_roots = {}
        self.fabric = {}
        self.xml_version = None

    def gpu(self, name):
        """The Gpu called ``name``; KeyError when absent."""
        for gpu in self.gpus:
            if gpu.name == name:
                return gpu
        raise KeyError(name)

    def link(self, a, b):
        """Level between GPUs ``a`` and ``b`` (names) or None."""
        return self.gpu_links.get((a, b) if a < b else (b, a))

    def set_link(self, a, b, level):
        """Record the level between GPUs ``a`` and ``b``."""
        self.gpu_links[(a, b) if a < b else (b, a)] = level

    def link_counts(self):
        """{level: number of GPU pairs} (the counts the tests assert)."""
        counts = {}
        for level in self.gpu_links.values():
            counts[level] = counts.get(level, 0) + 1
        return dict(sorted(counts.items()))

    def nearest_nics(self, gpu):
        """Names of the NICs at the nearest level from GPU ``gpu`` (name), in NIC order;
        empty when no GPU<->NIC path is known."""
        paths = [(nic, lvl) for (g, nic), lvl in self.gpu_nic.items() if g == gpu]
        if not paths:
            return []
        best = min(level_rank(lvl) for _, lvl in paths)
        names = {nic for nic, lvl in paths if level_rank(lvl) == best}
        return [n.name for n in self.nics if n.name in names]

    def xgmi_hives(self):
        """Sets of GPU names joined by XGMI links (connected parts of size >= 2), sorted."""
        return _components([pair for pair, lvl in self.gpu_links.items() if lvl == "XGMI"])

    def nvlink_islands(self):
        """Sets of GPU names joined by NVLink within this node (connected parts), sorted."""
        return _components([pair for pair, lvl in self.gpu_links.items() if _NV_RE.match(lvl)])

    def as_dict(self):
        """JSON-ready dict."""
        return {"host": self.host, "gpus": [g.as_dict() for g in self.gpus], "nics": [n.as_dict() for n in self.nics],
                "gpu_links": [[a, b, lvl] for (a, b), lvl in sorted(self.gpu_links.items())],
                "gpu_nic": [[g, n, lvl] for (g, n), lvl in sorted(self.gpu_nic.items())],
                "gpu_weights": [[a, b, w] for (a, b), w in sorted(self.gpu_weights.items())],
                "p2p": [[a, b, s] for (a, b), s in sorted(self.p2p.items())],
                "xgmi_hives": [sorted(h) for h in self.xgmi_hives()],
                "nvlink_islands": [sorted(h) for h in self.nvlink_islands()],
                "fabric": {g: list(v) for g, v in sorted(self.fabric.items())}}


def _components(pairs):
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        parent[find(a)] = find(b)
    groups = {}
    for x in list(parent):
        groups.setdefault(find(x), set()).add(x)
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: sorted(g))


class NVLinkDomain:
    """A multi-node NVLink domain: ``cluster_uuid`` (text) and ``clique_id`` (int) from NVML,
    or ``name`` alone when the source only names it (a Slurm block, a NetQ domain);
    ``hosts``: set of host names."""

    def __init__(self, cluster_uuid=None, clique_id=None, name=None, hosts=()):
        self.cluster_uuid, self.clique_id = cluster_uuid, clique_id
        self.name = name or ("%s/%s" % (cluster_uuid, clique_id))
        self.hosts = set(hosts)

    @property
    def key(self):
        """(cluster_uuid, clique_id): the identity of the domain (never clique_id alone)."""
        return (self.cluster_uuid, self.clique_id) if self.cluster_uuid is not None else ("", self.name)

    def as_dict(self):
        """JSON-ready dict."""
        return {"name": self.name, "cluster_uuid": self.cluster_uuid, "clique_id": self.clique_id,
                "hosts": sorted(self.hosts)}


class Topology:
    """Everything known: ``fabrics`` (list of Fabric), ``nodes`` ({host: NodeTopology}),
    ``domains`` ({key: NVLinkDomain}), ``block_sizes`` (list of int, from a Slurm block
    file, or None), ``other`` (kinds read but not modelled, e.g. yaml ring/torus3d)."""

    def __init__(self):
        self.fabrics = []
        self.nodes = {}
        self.domains = {}
        self.block_sizes = None
        self.other = []
        self.guid_maps = {}

    def add_domain_host(self, host, cluster_uuid=None, clique_id=None, name=None):
        """Put ``host`` in the NVLink domain (cluster_uuid, clique_id) (or named ``name``)."""
        domain = NVLinkDomain(cluster_uuid, clique_id, name)
        existing = self.domains.setdefault(domain.key, domain)
        existing.hosts.add(host)
        return existing

    def hosts(self):
        """Sorted names of every host any source mentions."""
        names = set(self.nodes)
        for fabric in self.fabrics:
            names.update(fabric.hosts())
        for domain in self.domains.values():
            names.update(domain.hosts)
        return sorted(names)

    def trees(self):
        """SwitchTrees of every fabric, a host kept under the first fabric that has it."""
        trees = []
        for fabric in self.fabrics:
            trees.extend(fabric.trees())
        _dedupe_hosts(trees)
        return [t for t in trees if t.hosts]

    def domain_of(self):
        """Host -> NVLinkDomain (first domain by key when a host is in several)."""
        found = {}
        for key in sorted(self.domains, key=lambda k: (str(k[0]), str(k[1]))):
            for host in self.domains[key].hosts:
                found.setdefault(host, self.domains[key])
        return found

    def as_dict(self):
        """JSON-ready dict of the whole model."""
        trees = self.trees()
        return {"fabrics": [f.as_dict() for f in self.fabrics],
                "trees": [{"root": t.root, "children": t.children, "hosts": t.hosts, "tier": t.tier} for t in trees],
                "nodes": {h: n.as_dict() for h, n in sorted(self.nodes.items())},
                "nvlink_domains": [d.as_dict() for _, d in sorted(self.domains.items(), key=lambda kv: str(kv[0]))],
                "block_sizes": self.block_sizes, "other": list(self.other)}
