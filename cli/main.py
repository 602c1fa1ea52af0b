"""``slurmbox`` command line: plugin install, dev cluster, sandbox listing."""

import importlib
import json

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
    """Build and install the SPANK shim and the task launcher."""


@plugin.command("install")
@click.option("--prefix", default="/opt/slurmbox", show_default=True, help="Install root (lib/, libexec/).")
def plugin_install(prefix):
    """Compile the shim against the installed Slurm and install the launcher.

    \b
    Example: slurmbox plugin install --prefix /opt/slurmbox
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
    """A real multi-node Slurm cluster on this machine (root only)."""


_DIR = click.option("--dir", "directory", default="/tmp/slurmbox-dev", show_default=True,
                    help="Directory holding the cluster's config, state and logs.")


@dev_cluster.command("up")
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 8))
@click.option("--gpus-per-node", default=2, show_default=True, type=click.IntRange(0, 16))
@click.option("--subnet", default=7, show_default=True, type=click.IntRange(1, 250),
              help="Third octet of the 10.213.X.0/24 node network; also offsets ports.")
@click.option("--prefix", default="/opt/slurmbox", show_default=True, help="Where slurmbox is installed.")
@_DIR
def dev_cluster_up(nodes, gpus_per_node, subnet, prefix, directory):
    """Start munge, slurmctld and NODES slurmd with fake GPUs and the slurmbox plugin.

    \b
    Example:
      slurmbox dev-cluster up --nodes 2 --gpus-per-node 2
      export SLURM_CONF=/tmp/slurmbox-dev/etc/slurm.conf
    """
    from slurmbox.dev_cluster.cluster import DevCluster, DevClusterError

    try:
        cluster = DevCluster(directory, nodes, gpus_per_node, subnet, prefix)
        conf = cluster.up()
    except DevClusterError as err:
        raise click.ClickException(str(err))
    click.echo("dev cluster up: nodes %s, partitions ondemand (default), spot, secure (sandbox required); "
               "state in %s" % (",".join(cluster.node_names), directory), err=True)
    click.echo("export SLURM_CONF=%s" % conf)


@dev_cluster.command("down")
@_DIR
def dev_cluster_down(directory):
    """Stop the dev cluster and remove everything 'up' created."""
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
    """Report the dev cluster's daemons and nodes."""
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
