"""Choose where an N-node job should run on the free nodes, given the topology.

Preference, in order (the field's usual rule for collective-heavy jobs):

1. all nodes under one leaf switch (no spine crossing at all); within the leaf, nodes of
   one NVLink domain first;
2. all nodes in one multi-node NVLink domain (their GPU traffic stays on NVLink);
3. otherwise the smallest switch subtree that holds N free nodes (the lowest common
   ancestor, so the fewest tiers crossed), filled from its fullest leaves first (the
   fewest leaves, so the fewest spine crossings).

Among equal choices the tightest fit wins (the leaf/domain/subtree with the fewest free
nodes, leaving larger groups whole for later jobs), then names in order: the result is
deterministic.

Score (0-100, higher is better): ``100 - 10 * (tiers crossed) - 2 * (leaves - 1) -
1 * (NVLink domains - 1)``, where tiers crossed is the tier of the lowest common switch
minus 1 (0 on one leaf). Slurm options that ask Slurm for the same shape:
``--switches=L`` (at most L leaf switches, sbatch(1)) and, with topology/block (Slurm >=
23.11), ``--segment=N`` (N nodes in one block, Slurm >= 24.11).
"""

from .hostlists import compress
from .model import TopologyError, natural_key


class Placement:
    """A chosen set of hosts: ``hosts`` (sorted), ``score``, ``why`` (text), ``leaves``
    (leaf switch names used), ``common_switch`` (lowest common switch or None),
    ``tiers_crossed``, ``domains`` (NVLink domain names used), ``slurm_options`` (list)."""

    def __init__(self, hosts, why, leaves, common_switch, tiers_crossed, domains, rule):
        self.hosts = sorted(hosts, key=natural_key)
        self.why = why
        self.leaves = leaves
        self.common_switch = common_switch
        self.tiers_crossed = tiers_crossed
        self.domains = domains
        self.rule = rule
        self.score = max(0, 100 - 10 * tiers_crossed - 2 * max(0, len(leaves) - 1) - max(0, len(domains) - 1))
        self.slurm_options = ["--nodes=%d" % len(self.hosts), "--nodelist=%s" % compress(self.hosts)]
        if leaves:
            self.slurm_options.append("--switches=%d" % len(leaves))
        if len(domains) == 1 and rule in ("leaf", "nvlink-domain"):
            self.slurm_options.append("--segment=%d" % len(self.hosts))

    def as_dict(self):
        """JSON-ready dict."""
        return {"hosts": self.hosts, "nodelist": compress(self.hosts), "score": self.score, "why": self.why,
                "rule": self.rule, "leaves": self.leaves, "common_switch": self.common_switch,
                "tiers_crossed": self.tiers_crossed, "nvlink_domains": self.domains,
                "slurm_options": self.slurm_options}


def _gpu_ok(topo, host, gpus_per_node):
    node = topo.nodes.get(host)
    return not gpus_per_node or node is None or not node.gpus or len(node.gpus) >= gpus_per_node


def place(topo, nodes, free, gpus_per_node=0, switch_names=None):
    """Best Placement of ``nodes`` hosts among ``free`` (iterable of host names).

    ``switch_names``: {switch ident: Slurm name} for messages (idents by default).
    Hosts whose known GPU count is below ``gpus_per_node`` are not used. Raises
    TopologyError when fewer than ``nodes`` usable free hosts exist.
    """
    if nodes < 1:
        raise TopologyError("--nodes must be at least 1")
    names = switch_names or {}
    free = {h for h in free if _gpu_ok(topo, h, gpus_per_node)}
    if len(free) < nodes:
        raise TopologyError("only %d free node(s)%s, %d requested" % (
            len(free), " with %d GPUs" % gpus_per_node if gpus_per_node else "", nodes))
    domain_of = {h: d.name for h, d in topo.domain_of().items()}
    trees = topo.trees()
    leaf_of, tier_paths = {}, {}
    for tree in trees:
        paths = tree.path_to_root()
        for host, leaf in tree.leaf_of().items():
            leaf_of[host] = leaf
            tier_paths[host] = paths[leaf]

    def by_domain(hosts):
        """Hosts ordered so that the biggest NVLink domain group comes first."""
        groups = {}
        for h in hosts:
            groups.setdefault(domain_of.get(h), []).append(h)
        ordered = sorted(groups.values(), key=lambda g: (-len(g), natural_key(min(g, key=natural_key))))
        return [h for g in ordered for h in sorted(g, key=natural_key)]

    def describe(hosts, rule, why):
        leaves = sorted({names.get(leaf_of[h], leaf_of[h]) for h in hosts if h in leaf_of}, key=natural_key)
        doms = sorted({domain_of[h] for h in hosts if h in domain_of})
        common, crossed = _common(hosts, tier_paths, trees)
        return Placement(hosts, why, leaves, names.get(common, common) if common else None, crossed, doms, rule)

    # 1. one leaf switch
    leaves = {}
    for h in free:
        if h in leaf_of:
            leaves.setdefault(leaf_of[h], []).append(h)
    fits = [(len(hs), natural_key(leaf), leaf) for leaf, hs in leaves.items() if len(hs) >= nodes]
    if fits:
        _, _, leaf = min(fits)
        chosen = by_domain(leaves[leaf])[:nodes]
        return describe(chosen, "leaf", "all %d node(s) on leaf switch %s (no spine crossing); tightest fit among %d "
                        "leaf switch(es) with room" % (nodes, names.get(leaf, leaf), len(fits)))
    # 2. one NVLink domain
    domains = {}
    for h in free:
        if h in domain_of:
            domains.setdefault(domain_of[h], []).append(h)
    fits = [(len(hs), d) for d, hs in domains.items() if len(hs) >= nodes]
    if fits and nodes > 1:
        _, dom = min(fits)
        members = domains[dom]
        # Inside the domain, fewest leaves: fullest leaves first.
        chosen = _fill_leaves(members, leaf_of, nodes)
        return describe(chosen, "nvlink-domain", "no leaf switch has %d free node(s); all in NVLink domain %s"
                        % (nodes, dom))
    # 3. smallest subtree
    best = None
    for tree in trees:
        below = {}
        for sw in reversed(tree.switches()):
            hs = [h for h in tree.hosts.get(sw, []) if h in free]
            for child in tree.children.get(sw, []):
                hs.extend(below[child])
            below[sw] = hs
            if len(hs) >= nodes:
                key = (tree.tier.get(sw, 0), len(hs), natural_key(sw))
                if best is None or key < best[0]:
                    best = (key, sw, hs)
    if best is not None:
        _, sw, hs = best
        chosen = _fill_leaves(hs, leaf_of, nodes, by_domain)
        return describe(chosen, "subtree", "no leaf switch or NVLink domain has %d free node(s); smallest switch "
                        "subtree with room is under %s, filled from its fullest leaves" % (nodes, names.get(sw, sw)))
    chosen = sorted(free, key=natural_key)[:nodes]
    unknown = [h for h in chosen if h not in leaf_of]
    return describe(chosen, "none", "no single fabric part holds %d free node(s)%s; Slurm with topology/tree will "
                    "not place a job across unconnected fabrics" % (
                        nodes, " (no topology known for %s)" % compress(unknown) if unknown else ""))


def _fill_leaves(hosts, leaf_of, nodes, order=None):
    groups = {}
    for h in hosts:
        groups.setdefault(leaf_of.get(h), []).append(h)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), natural_key(kv[0] or "")))
    chosen = []
    for _, hs in ordered:
        hs = order(hs) if order else sorted(hs, key=natural_key)
        chosen.extend(hs[:nodes - len(chosen)])
        if len(chosen) == nodes:
            break
    return chosen


def _common(hosts, tier_paths, trees):
    """(lowest common switch of ``hosts``, tiers crossed) or (None, 0) when unknown."""
    paths = [tier_paths[h] for h in hosts if h in tier_paths]
    if not paths or len(paths) != len(hosts):
        return None, 0
    roots = {p[-1] for p in paths}
    if len(roots) > 1:
        return None, max(len(p) for p in paths)
    common = None
    candidates = set(paths[0])
    for p in paths[1:]:
        candidates &= set(p)
    for sw in paths[0]:
        if sw in candidates:
            common = sw
            break
    tier = {}
    for tree in trees:
        tier.update(tree.tier)
    return common, max(0, tier.get(common, 1) - 1)
