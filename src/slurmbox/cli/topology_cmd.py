"""``slurmbox topology``: read the fabric and node topology, write Slurm's topology files and
NCCL topology XML, suggest placements and NCCL settings."""

import functools
import json
import os
import socket
import tempfile

import click

SOURCE_OPTIONS = [
    ("ibnetdiscover", "ibnetdiscover output (repeat for several subnets)."),
    ("ibstat", "HOST=FILE: ibstat or ibv_devinfo output of HOST (maps HCA GUIDs to hosts)."),
    ("nvidia-smi-topo", "[HOST=]FILE: 'nvidia-smi topo -m' output of a node."),
    ("amd-topo", "[HOST=]FILE: 'rocm-smi --showtopo' or 'amd-smi topology' output of a node."),
    ("nccl-xml", "[HOST=]FILE: an NCCL topology XML of a node."),
    ("topology-conf", "A Slurm topology.conf or topology.yaml."),
    ("netq", "A NetQ topology graph (JSON)."),
    ("fabric-info", "NVLink domains: YAML/JSON of host, cluster_uuid, clique_id (or NMX compute nodes)."),
    ("override", "Admin override file (YAML): see slurmbox.topology.override."),
]


def source_options(func):
    """Add the source options shared by generate/show/place/hints."""
    for name, text in reversed(SOURCE_OPTIONS):
        func = click.option("--" + name, name.replace("-", "_"), multiple=True, metavar="FILE", help=text)(func)
    func = click.option("--source", "auto_sources", multiple=True, metavar="[HOST=]FILE",
                        help="A source of any kind, detected from its content.")(func)
    func = click.option("--local", is_flag=True,
                        help="Also read this node through NVML/amdsmi/pyverbs and sysfs.")(func)
    func = click.option("--run-ibnetdiscover", is_flag=True, help="Run ibnetdiscover here and read its output.")(func)
    return func


def _errors(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from slurmbox.topology.model import TopologyError
        try:
            return func(*args, **kwargs)
        except TopologyError as err:
            raise click.ClickException(str(err))
        except OSError as err:
            raise click.ClickException("%s: %s" % (getattr(err, "filename", None) or "I/O", err.strerror or err))
    return wrapper


def build_topology(kwargs, need_source=True):
    """Topology from the source options in ``kwargs``; notes of local collection go to stderr."""
    from slurmbox.topology import ibnetdiscover, local, sources
    from slurmbox.topology.model import Topology, TopologyError

    topo = Topology()
    pairs = []
    # GUID maps (ibstat) first, so fabrics read later use them too; override last.
    order = ["ibstat"] + [n for n, _ in SOURCE_OPTIONS if n not in ("ibstat", "override")]
    for name in order:
        for spec in kwargs.get(name.replace("-", "_"), ()):
            pairs.append((name, spec))
    for spec in kwargs.get("auto_sources", ()):
        pairs.append((None, spec))
    for spec in kwargs.get("override", ()):
        pairs.append(("override", spec))
    for kind, spec in pairs:
        sources.load(topo, kind, spec)
    if kwargs.get("run_ibnetdiscover"):
        fabric = ibnetdiscover.run()
        fabric.map_guids(topo.guid_maps)
        topo.fabrics.append(fabric)
    if kwargs.get("local"):
        host = socket.gethostname().split(".")[0]
        node, notes = local.collect_local(host)
        for note in notes:
            click.echo("slurmbox: note: %s" % note, err=True)
        from slurmbox.topology import ibstat
        from slurmbox.topology.sources import merge_nics
        existing = topo.nodes.get(host)
        if existing is not None:
            merge_nics(node, existing.nics)
        topo.nodes[host] = node
        # This node's HCA GUIDs name it in fabrics whose NodeDescriptions do not.
        mapping = ibstat.guid_map(node.nics, host)
        topo.guid_maps.update(mapping)
        for fabric in topo.fabrics:
            fabric.map_guids(mapping)
        for gpu, (uuid, clique) in sorted(node.fabric.items()):
            topo.add_domain_host(host, uuid, clique)
    if need_source and not (pairs or kwargs.get("local") or kwargs.get("run_ibnetdiscover")):
        raise TopologyError("no topology source given; pass e.g. --ibnetdiscover FILE, --topology-conf FILE or --local")
    return topo


def _write(out, text):
    """Write ``text`` to ``out`` atomically (0644), or to stdout when ``out`` is None/-."""
    if not out or out == "-":
        click.echo(text, nl=False)
        return
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise click.ClickException("directory %s does not exist; create it first" % directory)
    fd, tmp = tempfile.mkstemp(prefix=".topology-", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    click.echo("wrote %s" % out, err=True)


@click.group()
def topology():
    """Fabric and GPU topology: Slurm topology files, placement, NCCL hints.

    \b
    Examples:
      slurmbox topology show --ibnetdiscover fabric.txt
      slurmbox topology generate --format tree --ibnetdiscover fabric.txt --out /etc/slurm/topology.conf
      slurmbox topology place --nodes 4 --topology-conf /etc/slurm/topology.conf
      slurmbox topology hints --nvidia-smi-topo node1=topo.txt --gpus 0,1
    """


@topology.command()
@click.option("--format", "fmt", type=click.Choice(["tree", "block", "yaml", "nccl-xml"]), required=True,
              help="tree/block: topology.conf (topology/tree, topology/block); yaml: topology.yaml (Slurm >= "
                   "25.05); nccl-xml: NCCL_TOPO_FILE of one node.")
@click.option("--block-sizes", metavar="N,N,...", help="BlockSizes (base, then base times powers of two).")
@click.option("--host", metavar="HOST", help="nccl-xml: the node to write (default: the only node known).")
@click.option("--out", metavar="FILE", help="Write here (atomically) instead of stdout.")
@source_options
@_errors
def generate(fmt, block_sizes, host, out, **kwargs):
    """Write Slurm's topology configuration or a node's NCCL topology XML.

    The output is deterministic: the same sources give the same bytes.

    \b
    Examples:
      slurmbox topology generate --format tree --ibnetdiscover fabric.txt --ibstat gpu001=ibstat.txt
      slurmbox topology generate --format block --fabric-info nvl.yaml --block-sizes 18,36,72
      slurmbox topology generate --format yaml --ibnetdiscover fabric.txt --fabric-info nvl.yaml
      slurmbox topology generate --format nccl-xml --local --out /etc/slurmbox/topology/$(hostname -s)/nccl-topo.xml
    """
    from slurmbox.topology import nccl_xml, slurm_out
    from slurmbox.topology.model import TopologyError

    topo = build_topology(kwargs)
    sizes = None
    if block_sizes:
        try:
            sizes = [int(v) for v in block_sizes.split(",") if v.strip()]
        except ValueError:
            raise TopologyError("--block-sizes %r: give integers separated by commas" % block_sizes)
    if fmt == "tree":
        text = slurm_out.write_tree(topo)
    elif fmt == "block":
        text = slurm_out.write_block(topo, sizes)
    elif fmt == "yaml":
        text = slurm_out.write_yaml(topo, sizes)
    else:
        if host is None:
            if len(topo.nodes) != 1:
                raise TopologyError("--format nccl-xml writes one node; %d are known, choose one with --host (%s)"
                                    % (len(topo.nodes), ", ".join(sorted(topo.nodes)) or "none"))
            host = next(iter(topo.nodes))
        if host not in topo.nodes:
            raise TopologyError("no node topology for %s" % host)
        text = nccl_xml.to_xml(topo.nodes[host])
    _write(out, text)


@topology.command()
@click.option("--json", "as_json", is_flag=True, help="Print the whole model as JSON.")
@source_options
@_errors
def show(as_json, **kwargs):
    """Show the topology model read from the sources.

    \b
    Examples:
      slurmbox topology show --ibnetdiscover fabric.txt
      slurmbox topology show --local --json
      slurmbox topology show --source node1=topo.txt --source fabric.txt
    """
    topo = build_topology(kwargs)
    if as_json:
        click.echo(json.dumps(topo.as_dict(), indent=2, sort_keys=True))
        return
    from slurmbox.topology.hostlists import compress
    from slurmbox.topology.slurm_out import switch_names

    names = switch_names(topo)
    for index, fabric in enumerate(topo.fabrics):
        click.echo("fabric %s (%s): %d switch(es), %d CA(s), %d host(s), %d link(s)" % (
            os.path.basename(fabric.name), fabric.link_layer, len(fabric.switches()), len(fabric.cas()),
            len(fabric.hosts()), len(fabric.links)))
        unmapped = fabric.unmapped_cas()
        if unmapped:
            click.echo("  %d CA(s) name no host (map them with --ibstat HOST=FILE)" % len(unmapped))
        for warning in fabric.warnings:
            click.echo("  note: %s" % warning)
        for tree in fabric.trees():
            click.echo("  tree rooted at %s:" % names[(index, tree.root)])
            for sw in tree.switches():
                hosts = tree.hosts.get(sw)
                click.echo("    %s%s (tier %d)%s" % ("  " * (tree.tier[tree.root] - tree.tier.get(sw, 0)),
                                                   names[(index, sw)], tree.tier.get(sw, 0),
                                                   ": " + compress(hosts) if hosts else ""))
    for host, node in sorted(topo.nodes.items()):
        click.echo("node %s: %d GPU(s), %d NIC(s)" % (host, len(node.gpus), len(node.nics)))
        counts = node.link_counts()
        if counts:
            click.echo("  GPU pairs: %s" % ", ".join("%s %d" % kv for kv in counts.items()))
        for hive in node.xgmi_hives():
            click.echo("  XGMI hive: %s" % ",".join(sorted(hive)))
        for gpu in node.gpus:
            nearest = node.nearest_nics(gpu.name)
            if nearest:
                click.echo("  %s nearest NIC(s): %s" % (gpu.name, ",".join(nearest)))
        for nic in node.nics:
            click.echo("  NIC %s: %s" % (nic.name, nic.link_layer or "link layer unknown"))
    for key, domain in sorted(topo.domains.items(), key=lambda kv: str(kv[0])):
        click.echo("NVLink domain %s: %s" % (domain.name, compress(domain.hosts)))
    if topo.block_sizes:
        click.echo("BlockSizes: %s" % ",".join(str(s) for s in topo.block_sizes))
    for other in topo.other:
        click.echo("not modelled: %s" % other)


def _free_nodes(free):
    from slurmbox.topology.hostlists import expand
    if free:
        return expand(free)
    from slurmbox.slurm_client.scontrol import SlurmCommandError, idle_nodes
    try:
        return idle_nodes()
    except SlurmCommandError as err:
        raise click.ClickException("cannot ask Slurm for idle nodes (%s); pass --free HOSTLIST" % err)


@topology.command()
@click.option("--nodes", type=int, required=True, help="Number of nodes.")
@click.option("--gpus-per-node", type=int, default=0, help="GPUs each node must have (when known).")
@click.option("--free", metavar="HOSTLIST", help="Free nodes (default: Slurm's idle nodes, from sinfo).")
@click.option("--json", "as_json", is_flag=True, help="Print the placement as JSON.")
@source_options
@_errors
def place(nodes, gpus_per_node, free, as_json, **kwargs):
    """Best placement for NODES nodes: one leaf switch, else one NVLink domain, else the
    fewest spine crossings; with its score, why, and the Slurm options that ask for it.

    \b
    Examples:
      slurmbox topology place --nodes 4 --topology-conf /etc/slurm/topology.conf
      slurmbox topology place --nodes 2 --free 'gpu[001-016]' --ibnetdiscover fabric.txt --json
    """
    from slurmbox.topology import place as placement
    from slurmbox.topology.slurm_out import switch_names

    topo = build_topology(kwargs)
    names = {ident: name for (_, ident), name in switch_names(topo).items()}
    result = placement.place(topo, nodes, _free_nodes(free), gpus_per_node, names)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2, sort_keys=True))
        return
    click.echo("nodes: %s" % result.as_dict()["nodelist"])
    click.echo("score: %d/100 (%s)" % (result.score, result.rule))
    click.echo("why: %s" % result.why)
    click.echo("slurm: %s" % " ".join(result.slurm_options))


@topology.command()
@click.option("--host", metavar="HOST", help="The node (default: the only node known).")
@click.option("--gpus", metavar="I,J,...", help="GPU indices of the step on this node (default: all).")
@click.option("--step-nodes", metavar="HOSTLIST", help="All nodes of the step (for NCCL_MNNVL_ENABLE).")
@click.option("--json", "as_json", is_flag=True, help="Print the variables as JSON.")
@source_options
@_errors
def hints(host, gpus, step_nodes, as_json, **kwargs):
    """NCCL/RCCL environment for a step: NCCL_IB_HCA, NCCL_SOCKET_IFNAME, NCCL_IB_GID_INDEX,
    NCCL_CROSS_NIC, NCCL_MNNVL_ENABLE (printed as shell 'export' lines).

    \b
    Examples:
      slurmbox topology hints --nvidia-smi-topo n1=topo.txt --ibstat n1=ibstat.txt --gpus 0,1
      slurmbox topology hints --local --json
    """
    from slurmbox.topology import nccl_hints
    from slurmbox.topology.hostlists import expand
    from slurmbox.topology.model import TopologyError

    topo = build_topology(kwargs)
    if host is None:
        if len(topo.nodes) != 1:
            raise TopologyError("give --host (%d nodes known: %s)" % (len(topo.nodes), ", ".join(sorted(topo.nodes))))
        host = next(iter(topo.nodes))
    if host not in topo.nodes:
        raise TopologyError("no node topology for %s" % host)
    indices = None
    if gpus:
        try:
            indices = [int(x) for x in gpus.split(",") if x.strip()]
        except ValueError:
            raise TopologyError("--gpus %r: give GPU indices separated by commas" % gpus)
    env = nccl_hints.step_hints(topo.nodes[host], indices, expand(step_nodes) if step_nodes else None,
                                topo.domain_of())
    if as_json:
        click.echo(json.dumps(env, indent=2, sort_keys=True))
        return
    import shlex
    for key, value in sorted(env.items()):
        click.echo("export %s=%s" % (key, shlex.quote(value)))
