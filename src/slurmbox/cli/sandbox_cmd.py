"""``slurmbox sandbox ls|inspect|kill``: the sandboxes running on this machine."""

import json
import os

import click

from slurmbox.sandbox import registry
from slurmbox.settings.plugstack import PlugstackError, slurmbox_settings


def _runtime_dir(runtime_dir, slurm_conf):
    if runtime_dir:
        return runtime_dir
    try:
        return slurmbox_settings(slurm_conf)["runtime_dir"]
    except PlugstackError as err:
        raise click.ClickException("%s (or pass --runtime-dir)" % err)


def _slurm_env(slurm_conf):
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return env


_RUNTIME = click.option("--runtime-dir", default=None,
                        help="slurmbox's runtime directory [default: runtime_dir= of the slurmbox line in "
                             "plugstack.conf].")
_SLURM_CONF = click.option("--slurm-conf", default=None, envvar="SLURM_CONF",
                           help="slurm.conf whose plugstack.conf to read [default: $SLURM_CONF or "
                                "/etc/slurm/slurm.conf].")
_NODE = click.option("--node", default=None, help="Only the sandbox on this Slurm node (a machine may run several).")


@click.group()
def sandbox():
    """List, inspect and kill the sandboxes of job steps on this machine.

    Root sees every sandbox; any other user sees only their own jobs' sandboxes.
    A sandbox id is the step id, JOB.STEP (e.g. 1234.0, 1234.batch).

    \b
    Examples:
      slurmbox sandbox ls
      slurmbox sandbox ls --json
      slurmbox sandbox inspect 1234.0
      slurmbox sandbox kill 1234.0          # root only
    """


@sandbox.command("ls")
@_RUNTIME
@_SLURM_CONF
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def sandbox_ls(runtime_dir, slurm_conf, as_json):
    """List sandboxes: id, job, step, user, node, age, state.

    \b
    Examples:
      slurmbox sandbox ls
      slurmbox sandbox ls --json | jq '.[] | select(.state=="running") | .id'
    """
    directory = _runtime_dir(runtime_dir, slurm_conf)
    try:
        entries = registry.list_sandboxes(directory, slurm_env=_slurm_env(slurm_conf))
    except registry.SandboxError as err:
        raise click.ClickException(str(err))
    if as_json:
        click.echo(json.dumps([e.to_json() for e in entries], indent=2))
        return
    click.echo("%-16s %-10s %-8s %-12s %-10s %8s  %s" % ("ID", "JOB", "STEP", "USER", "NODE", "AGE", "STATE"))
    for e in entries:
        click.echo("%-16s %-10s %-8s %-12s %-10s %7.0fs  %s" % (e.id, e.job, e.step, e.user, e.node, e.age_s, e.state))


@sandbox.command("inspect")
@click.argument("sandbox_id")
@_NODE
@_RUNTIME
@_SLURM_CONF
def sandbox_inspect(sandbox_id, node, runtime_dir, slurm_conf):
    """Print the sandbox's record as JSON: its OCI spec (without the task's
    environment), devices, mounts, network, platform, profile and partition.
    A multi-node step on a machine running several nodes prints one record per node.

    \b
    Examples:
      slurmbox sandbox inspect 1234.batch
      slurmbox sandbox inspect 1234.0 --node n1
    """
    directory = _runtime_dir(runtime_dir, slurm_conf)
    as_root = os.geteuid() == 0
    try:
        entries = registry.find(directory, sandbox_id, node, slurm_env=_slurm_env(slurm_conf))
        records = [registry.read_record(e, as_root) for e in entries]
    except registry.SandboxError as err:
        raise click.ClickException(str(err))
    click.echo(json.dumps(records[0] if len(records) == 1 else records, indent=2, sort_keys=True))


@sandbox.command("kill")
@click.argument("sandbox_id")
@_NODE
@_RUNTIME
@_SLURM_CONF
@click.option("--reason", default="killed by an administrator", show_default=True,
              help="Written to the step's slurmbox log.")
def sandbox_kill(sandbox_id, node, runtime_dir, slurm_conf, reason):
    """Kill every process in the sandbox (root only). The job's tasks end as
    if killed by SIGKILL: an ordinary failure that the job's user sees from
    srun/sacct; the sandbox is then torn down as after any task end.

    \b
    Examples:
      slurmbox sandbox kill 1234.0
      slurmbox sandbox kill 1234.0 --node n1 --reason "runaway candidate"
    """
    if os.geteuid() != 0:
        raise click.ClickException("only root may kill sandboxes; to end your own job use scancel")
    directory = _runtime_dir(runtime_dir, slurm_conf)
    try:
        for entry in registry.find(directory, sandbox_id, node, slurm_env=_slurm_env(slurm_conf)):
            registry.kill(entry, reason)
            click.echo("killed sandbox %s on %s" % (entry.id, entry.node))
    except registry.SandboxError as err:
        raise click.ClickException(str(err))
