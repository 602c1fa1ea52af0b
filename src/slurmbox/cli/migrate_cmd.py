"""``slurmbox migrate`` (maintenance) and ``slurmbox spot-watch`` (spot reclaim notices)."""

import json
import os
import socket
import sys
import time

import click

from slurmbox.migrate.outcomes import Outcome

MIGRATE_EXAMPLES = """
\b
Examples (as root, on the node or where its runtime directory is visible):
  slurmbox migrate --node n1 --reason "kernel update"
  slurmbox migrate --node n1 --watch          # evacuate when n1 is drained or enters a MAINT reservation
"""
SPOT_EXAMPLES = """
\b
Examples (as root, one per node, e.g. a systemd service):
  slurmbox spot-watch --provider aws
  slurmbox spot-watch --provider gcp --interval 1
  slurmbox spot-watch --provider azure --metadata-url http://127.0.0.1:8080 --node n1 --once
"""


def _need_root():
    if os.geteuid() != 0:
        raise click.ClickException("this command must run as root (it talks to root-only step supervisors "
                                   "and drains nodes)")


def _report(report, as_json):
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    click.echo("node %s: %s (%s)" % (report.node, "drained" if report.drained else "not drained by slurmbox",
                                     report.reason))
    for step in report.steps:
        click.echo("  job %s step %s: %s%s" % (step.job, step.step, step.outcome,
                                             " - %s" % step.message if step.message else ""))
    click.echo("  requeued: %s" % (", ".join(report.requeued) or "none"))
    for error in report.errors:
        click.echo("  error: %s" % error, err=True)


def _common(node, slurm_conf, runtime_dir):
    from slurmbox.migrate.locate import find_runtime_dir
    from slurmbox.slurm_client import scontrol

    env = scontrol.slurm_env(slurm_conf)
    return node or socket.gethostname().split(".")[0], env, find_runtime_dir(runtime_dir, slurm_conf)


@click.command("migrate", epilog=MIGRATE_EXAMPLES)
@click.option("--node", default=None, help="Slurm node to evacuate (default: this host's short name).")
@click.option("--reason", default="maintenance", show_default=True, help="Why (goes into the drain reason).")
@click.option("--watch", is_flag=True, help="Wait until the node is drained or in maintenance, then evacuate.")
@click.option("--interval", default=10.0, show_default=True, help="Seconds between node state polls (--watch).")
@click.option("--no-drain", is_flag=True, help="Do not drain the node (it is drained already).")
@click.option("--runtime-dir", default=None, help="slurmbox runtime directory (default: from plugstack.conf).")
@click.option("--slurm-conf", default=None, help="slurm.conf (default: $SLURM_CONF or /etc/slurm/slurm.conf).")
@click.option("--json", "as_json", is_flag=True, help="Print the evacuation report as JSON.")
def migrate(node, reason, watch, interval, no_drain, runtime_dir, slurm_conf, as_json):
    """Checkpoint every sandboxed job on NODE, requeue its jobs and drain it, so they continue elsewhere."""
    from slurmbox.migrate.evacuate import evacuate_node, node_needs_evacuation
    from slurmbox.slurm_client import scontrol

    _need_root()
    node, env, runtime_dir = _common(node, slurm_conf, runtime_dir)
    if watch:
        while True:
            try:
                if node_needs_evacuation(node, env=env) and scontrol.running_jobs_on_node(node, env=env):
                    break
            except scontrol.SlurmCommandError as err:
                click.echo("slurmbox migrate: %s (retrying)" % err, err=True)
            time.sleep(interval)
    # --watch: the node is drained or reserved for maintenance already; keep the admin's reason.
    report = evacuate_node(node, "slurmbox migrate: %s" % reason, runtime_dir, env=env,
                           drain=not (no_drain or watch))
    _report(report, as_json)
    if report.errors or any(s.outcome == Outcome.FAILED for s in report.steps):
        sys.exit(1)


@click.command("spot-watch", epilog=SPOT_EXAMPLES)
@click.option("--provider", type=click.Choice(["aws", "gcp", "azure"]), required=True, help="Cloud provider.")
@click.option("--metadata-url", default=None, help="Metadata service base URL (default: the provider's).")
@click.option("--node", default=None, help="Slurm node name of this machine (default: short host name).")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between polls.")
@click.option("--once", is_flag=True, help="Poll once: evacuate if a notice is there, else exit 0.")
@click.option("--azure-resource", default=None, help="Azure: only Preempt events naming this VM.")
@click.option("--runtime-dir", default=None, help="slurmbox runtime directory (default: from plugstack.conf).")
@click.option("--slurm-conf", default=None, help="slurm.conf (default: $SLURM_CONF or /etc/slurm/slurm.conf).")
@click.option("--json", "as_json", is_flag=True, help="Print the evacuation report as JSON.")
def spot_watch(provider, metadata_url, node, interval, once, azure_resource, runtime_dir, slurm_conf, as_json):
    """Poll the cloud's metadata service; on a reclaim notice checkpoint every sandbox on this node,
    requeue its jobs and drain it (exits after the evacuation)."""
    from slurmbox.migrate import spot
    from slurmbox.migrate.evacuate import evacuate_node

    _need_root()
    node, env, runtime_dir = _common(node, slurm_conf, runtime_dir)
    base = metadata_url or spot.DEFAULT_URLS[provider]
    last_error = None
    while True:
        try:
            if provider == "azure":
                notice = spot.poll_azure(base, resource=azure_resource)
            else:
                notice = spot.poll(provider, base)
            last_error = None
        except spot.MetadataError as err:
            notice = None
            if str(err) != last_error:  # say it once, not every poll
                click.echo("slurmbox spot-watch: %s (still polling)" % err, err=True)
                last_error = str(err)
        if notice is not None:
            click.echo("slurmbox spot-watch: %s" % notice.reason(), err=True)
            report = evacuate_node(node, notice.reason(), runtime_dir, env=env)
            _report(report, as_json)
            sys.exit(1 if report.errors else 0)
        if once:
            if last_error:
                raise click.ClickException("cannot read the %s metadata service: %s" % (provider, last_error))
            if not as_json:
                click.echo("no reclaim notice from %s at %s" % (provider, base))
            return
        time.sleep(interval)
