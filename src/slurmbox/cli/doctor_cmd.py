"""``slurmbox doctor``: check this node, check by check."""

import json
import sys

import click

_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "not-present": "n/a "}


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema slurmbox-doctor/1).")
@click.option("--node", default=None, help="Slurm node name of this machine (default: short host name).")
@click.option("--slurm-conf", default=None, help="slurm.conf path (default: $SLURM_CONF or /etc/slurm/slurm.conf).")
@click.option("--site-config", default=None,
              help="Site configuration (default: site_config= of slurmbox's plugstack.conf line).")
@click.option("--gres-conf", default=None, help="gres.conf path (default: next to slurm.conf).")
@click.option("--schema", "show_schema", is_flag=True, help="Print the JSON Schema of --json and exit.")
def doctor(as_json, node, slurm_conf, site_config, gres_conf, show_schema):
    """Check this node before it takes sandboxed jobs.

    Each check says pass, warn, fail or not-present (hardware this node does
    not have) and what to do: runsc present, its version, a trivial sandbox
    starting, the device proxy and driver the accelerators need; gres.conf
    device files; NVML (nvidia-ml-py) and AMD SMI (amdsmi); RDMA ports
    (pyverbs); the site configuration (valid, this node in a node group,
    plugstack required_partitions matching it, CPUs and memory against
    `slurmd -C`); munge, slurmd and slurmctld; cgroup version; permission to
    set GPU clocks; free space in the checkpoint store. Exit status 1 when
    any check fails, else 0.

    \b
    Examples:
      slurmbox doctor
      slurmbox doctor --json | jq '.checks[] | select(.status == "fail")'
      # node n1 of `slurmbox dev-cluster up` (its slurmd lives in a network namespace):
      SLURM_CONF=/tmp/slurmbox-dev/etc/slurm.conf nsenter --net=/var/run/netns/sbx7-n1 slurmbox doctor --node n1
    """
    from slurmbox.doctor.report import JSON_SCHEMA
    from slurmbox.doctor.run import doctor as run_doctor

    if show_schema:
        click.echo(json.dumps(JSON_SCHEMA, indent=2))
        return
    result, checks = run_doctor(node, slurm_conf, site_config, gres_conf)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo("slurmbox doctor: node %s" % result["node"])
        for check in checks:
            click.echo("%s  %-22s %s" % (_MARK[check.status], check.id, check.summary))
            if check.status in ("warn", "fail"):
                click.echo("      -> %s" % check.action)
        counts = result["summary"]
        click.echo("%d pass, %d warn, %d fail, %d not present" % (counts["pass"], counts["warn"], counts["fail"],
                                                                 counts["not-present"]))
    if not result["ok"]:
        click.echo("doctor: %d check(s) failed on %s" % (result["summary"]["fail"], result["node"]), err=True)
        sys.exit(1)
