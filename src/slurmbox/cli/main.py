"""``slurmbox`` command line: plugin install, dev cluster, sandbox listing."""

import importlib
import json
import os

import click


class LazyGroup(click.Group):
    """A click group whose subcommands live in their own modules, imported on first use.

    ``lazy`` maps a command name to ``"module:attribute"``. A broken or slow
    subcommand module then costs nothing to the others (``slurmbox --help``
    lists every name without importing them).
    """

    def __init__(self, *args, lazy=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name in self.lazy:
            module_name, attribute = self.lazy[name].split(":")
            return getattr(importlib.import_module(module_name), attribute)
        return super().get_command(ctx, name)


# Subcommand groups, each in its own module under slurmbox/cli/.
SUBCOMMANDS = {
    "config": "slurmbox.cli.config_cmd:config",
    "doctor": "slurmbox.cli.doctor_cmd:doctor",
    "sandbox": "slurmbox.cli.sandbox_cmd:sandbox",
    "topology": "slurmbox.cli.topology_cmd:topology",
    "checkpoint": "slurmbox.cli.checkpoint_cmd:checkpoint",
    "migrate": "slurmbox.cli.migrate_cmd:migrate",
    "spot-watch": "slurmbox.cli.migrate_cmd:spot_watch",
    "measure": "slurmbox.cli.measure_cmd:measure",
}


@click.group(cls=LazyGroup, lazy=SUBCOMMANDS)
def cli():
    """slurmbox: run Slurm job steps inside gVisor sandboxes.

    \b
    Examples:
      slurmbox plugin install --prefix /opt/slurmbox
      slurmbox dev-cluster up --nodes 2 --gpus-per-node 2
      srun --sandbox hostname
    """


@cli.group()
def plugin():
    """Build and install the SPANK shim and the task launcher.

    \b
    Examples:
      slurmbox plugin install --prefix /opt/slurmbox
    """


@plugin.command("install")
@click.option("--prefix", default="/opt/slurmbox", show_default=True, help="Install root (lib/, libexec/).")
def plugin_install(prefix):
    """Compile the shim against the installed Slurm and install the launcher.

    \b
    Examples:
      slurmbox plugin install --prefix /opt/slurmbox
    """
    from slurmbox.spank_plugin.install import BuildError, install

    try:
        paths = install(prefix)
    except BuildError as err:
        raise click.ClickException(str(err))
    for name, path in paths.items():
        click.echo("%s: %s" % (name, path))


@cli.group("dev-cluster")
def dev_cluster():
    """A real multi-node Slurm cluster on this machine (root only).

    \b
    Examples:
      slurmbox dev-cluster up --nodes 2 --gpus-per-node 2
      slurmbox dev-cluster status --json
      slurmbox dev-cluster down
    """


_DIR = click.option("--dir", "directory", default="/tmp/slurmbox-dev", show_default=True,
                    help="Directory holding the cluster's config, state and logs.")


@dev_cluster.command("up")
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 8))
@click.option("--gpus-per-node", default=2, show_default=True, type=click.IntRange(0, 16))
@click.option("--subnet", default=7, show_default=True, type=click.IntRange(1, 250),
              help="Third octet of the 10.213.X.0/24 node network; also offsets ports.")
@click.option("--prefix", default="/opt/slurmbox", show_default=True, help="Where slurmbox is installed.")
@click.option("--rendered", type=click.Path(exists=True, file_okay=False), default=None,
              help="Boot from what 'slurmbox config render' wrote into this directory: its slurm-nodes.conf "
                   "replaces the built-in nodes and partitions, and its gres.conf, cgroup.conf, "
                   "plugstack.conf and topology.conf (when present) are used as they are. The site's nodes "
                   "must be named n1..nN with NodeAddr 10.213.SUBNET.(10+i).")
@click.option("--site-config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --rendered: the site configuration it was rendered from, installed as the cluster's "
                   "site.yaml (the file the rendered plugstack.conf should name).")
@_DIR
def dev_cluster_up(nodes, gpus_per_node, subnet, prefix, rendered, site_config, directory):
    """Start munge, slurmctld and NODES slurmd with fake GPUs and the slurmbox plugin.

    \b
    Examples:
      slurmbox dev-cluster up --nodes 2 --gpus-per-node 2
      export SLURM_CONF=/tmp/slurmbox-dev/etc/slurm.conf
      slurmbox config render site.yaml --out rendered/
      slurmbox dev-cluster up --rendered rendered/ --site-config site.yaml
    """
    from slurmbox.dev_cluster.cluster import DevCluster, DevClusterError

    try:
        nodes_conf, extra_files = _rendered_files(rendered, site_config)
        cluster = DevCluster(directory, nodes, gpus_per_node, subnet, prefix, nodes_conf=nodes_conf,
                             extra_files=extra_files)  # refuses rendered files that do not fit
        conf = cluster.up()
    except DevClusterError as err:
        raise click.ClickException(str(err))
    partitions = ("from %s" % rendered if rendered else
                  "ondemand (default), spot, secure (sandbox required)")
    click.echo("dev cluster up: nodes %s, partitions %s; state in %s"
               % (",".join(cluster.node_names), partitions, directory), err=True)
    click.echo("export SLURM_CONF=%s" % conf)


#: Files of ``slurmbox config render`` that a dev cluster uses as they are (slurm-nodes.conf is merged).
RENDERED_FILES = ("gres.conf", "cgroup.conf", "plugstack.conf", "topology.conf")


def _rendered_files(rendered, site_config):
    """(nodes_conf text or None, {file name: text}) for DevCluster from a render directory and site file."""
    if rendered is None:
        if site_config is not None:
            raise click.UsageError("--site-config goes with --rendered DIR")
        return None, {}
    nodes = os.path.join(rendered, "slurm-nodes.conf")
    try:
        with open(nodes) as handle:
            nodes_conf = handle.read()
        extra = {}
        for name in RENDERED_FILES:
            path = os.path.join(rendered, name)
            if os.path.exists(path):
                with open(path) as handle:
                    extra[name] = handle.read()
        if site_config is not None:
            with open(site_config) as handle:
                extra["site.yaml"] = handle.read()
    except (OSError, UnicodeDecodeError) as err:
        raise click.ClickException("cannot read the rendered files in %s: %s (run 'slurmbox config render FILE "
                                   "--out %s' first)" % (rendered, err, rendered))
    return nodes_conf, extra


@dev_cluster.command("down")
@_DIR
def dev_cluster_down(directory):
    """Stop the dev cluster and remove everything 'up' created.

    \b
    Examples:
      slurmbox dev-cluster down
      slurmbox dev-cluster down --dir /tmp/my-cluster
    """
    from slurmbox.dev_cluster.cluster import DevCluster, DevClusterError

    try:
        DevCluster.load(directory).down()
    except DevClusterError as err:
        raise click.ClickException(str(err))
    click.echo("dev cluster in %s stopped and removed" % directory)


@dev_cluster.command("status")
@_DIR
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def dev_cluster_status(directory, as_json):
    """Report the dev cluster's daemons and nodes.

    \b
    Examples:
      slurmbox dev-cluster status
      slurmbox dev-cluster status --json
    """
    from slurmbox.dev_cluster.cluster import DevCluster, DevClusterError

    try:
        status = DevCluster.load(directory).status()
    except DevClusterError as err:
        raise click.ClickException(str(err))
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    click.echo("SLURM_CONF=%s" % status["slurm_conf"])
    for name, alive in status["daemons"].items():
        click.echo("%-12s %s" % (name, "running" if alive else "stopped"))
    for line in status["nodes"]:
        click.echo(line)


if __name__ == "__main__":
    cli()
