"""``slurmbox checkpoint``: list, verify and garbage-collect sandbox checkpoints."""

import json
import os

import click

EXAMPLES = """
\b
Examples:
  slurmbox checkpoint ls                 # every job's checkpoints you may read
  slurmbox checkpoint ls 1234 --json
  slurmbox checkpoint verify 1234        # checksums of every image file
  slurmbox checkpoint gc --finished      # root: drop partial writes, old and finished jobs' images
"""

_store_options = [
    click.option("--store", default=None, help="Checkpoint store directory (default: the site configuration's)."),
    click.option("--site-config", default=None, help="Site configuration (default: site_config= of plugstack.conf)."),
    click.option("--slurm-conf", default=None, help="slurm.conf (default: $SLURM_CONF or /etc/slurm/slurm.conf)."),
]


def store_options(func):
    for option in reversed(_store_options):
        func = option(func)
    return func


def _store(store, site_config, slurm_conf):
    from slurmbox.migrate.locate import LocateError, find_store
    from slurmbox.migrate.store import CheckpointError

    try:
        return find_store(store, site_config, slurm_conf)
    except (LocateError, CheckpointError) as err:
        raise click.ClickException(str(err))


def _checkpoints(st, job):
    """[(Checkpoint)] of ``job`` (all steps); raises ClickException when the caller may not read them."""
    try:
        found = []
        for step in st.steps(job):
            found += st.checkpoints(job, step)
        return found
    except PermissionError:
        raise click.ClickException("you may not read the checkpoints of job %s: they belong to another user "
                                   "(only root and the job's user can)" % job)


@click.group(epilog=EXAMPLES)
def checkpoint():
    """Sandbox checkpoints of preemptible jobs (see slurmbox.migrate)."""


@checkpoint.command("ls", epilog=EXAMPLES)
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of checkpoints.")
@store_options
def ls(job, as_json, store, site_config, slurm_conf):
    """List the checkpoints of JOB (default: of every job you may read), newest first."""
    from slurmbox.migrate.store import CheckpointError

    st = _store(store, site_config, slurm_conf)
    try:
        jobs = [job] if job else st.jobs()
    except PermissionError:
        raise click.ClickException("cannot list the checkpoint store %s" % st.root)
    rows = []
    for name in jobs:
        try:
            rows += [c.summary() for c in _checkpoints(st, name)]
        except click.ClickException:
            if job:
                raise
        except CheckpointError as err:
            raise click.ClickException(str(err))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no checkpoints%s in %s" % (" of job %s" % job if job else "", st.root))
        return
    click.echo("%-8s %-9s %-12s %-6s %-21s %-12s %10s  %s" % ("JOB", "STEP", "NAME", "NODE", "TIME", "REASON",
                                                             "MB", "MANIFEST"))
    for row in rows:
        click.echo("%-8s %-9s %-12s %-6s %-21s %-12s %10.1f  %s" % (
            row["job"], row["step"], row["name"], row["node"] or "-", row["time"] or "-", row["reason"] or "-",
            row["bytes"] / 1e6, row["manifest"]))


@checkpoint.command("verify", epilog=EXAMPLES)
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@store_options
def verify(job, as_json, store, site_config, slurm_conf):
    """Check every checkpoint of JOB against its manifest (sizes, sha256). Exit status 1 if any is bad."""
    st = _store(store, site_config, slurm_conf)
    results = []
    for ckpt in _checkpoints(st, job):
        verdict = st.verify(ckpt)
        results.append({"job": ckpt.job, "step": ckpt.step, "name": ckpt.name, "valid": verdict.valid,
                        "problems": verdict.problems})
    if as_json:
        click.echo(json.dumps(results, indent=2))
    elif not results:
        click.echo("no checkpoints of job %s in %s" % (job, st.root))
    else:
        for result in results:
            click.echo("%s %s %s: %s" % (result["job"], result["step"], result["name"],
                                         "ok" if result["valid"] else "BAD: " + "; ".join(result["problems"])))
    if any(not r["valid"] for r in results):
        raise SystemExit(1)


@checkpoint.command("gc", epilog=EXAMPLES)
@click.option("--finished", is_flag=True, help="Also remove the checkpoints of jobs slurmctld no longer lists.")
@click.option("--json", "as_json", is_flag=True, help="Print the removed paths as JSON.")
@store_options
def gc(finished, as_json, store, site_config, slurm_conf):
    """Remove interrupted (partial) checkpoints, images beyond keep_last and, with --finished, finished jobs'."""
    if os.geteuid() != 0:
        raise click.ClickException("checkpoint gc must run as root (the store is root-owned)")
    st = _store(store, site_config, slurm_conf)
    live = None
    if finished:
        from slurmbox.slurm_client import scontrol

        env = scontrol.slurm_env(slurm_conf)
        try:
            live = scontrol.all_job_ids(env=env)
        except scontrol.SlurmCommandError as err:
            raise click.ClickException("cannot list jobs to find finished ones: %s" % err)
    removed = st.gc(live_jobs=live)
    if as_json:
        click.echo(json.dumps({"store": st.root, "removed": removed}, indent=2))
    else:
        for path in removed:
            click.echo("removed %s" % path)
        click.echo("%d removed from %s" % (len(removed), st.root))
