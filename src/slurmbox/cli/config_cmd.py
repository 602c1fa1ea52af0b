"""``slurmbox config``: validate a site configuration and render the Slurm files from it."""

import json
import os
import sys

import click

#: Exit status for an invalid configuration (as click uses for usage errors).
EXIT_INVALID = 2


def _load(path):
    """(SiteModel, raw bytes) of ``path``; prints the problems and exits 2 when invalid."""
    from slurmbox.settings.model import SiteConfigError, load_site

    try:
        with open(path, "rb") as handle:
            raw = handle.read()
        return load_site(raw, path), raw, None
    except OSError as err:
        return None, None, SiteConfigError(path, [("", None, "cannot read the file: %s" % (err.strerror or err))])
    except SiteConfigError as err:
        return None, None, err


def _fail(err, as_json):
    if as_json:
        click.echo(json.dumps({"file": err.source, "valid": False,
                               "problems": [{"path": p, "line": l, "message": m} for p, l, m in err.details]},
                              indent=2))
    for line in err.lines():
        click.echo(line, err=True)
    sys.exit(EXIT_INVALID)


@click.group()
def config():
    """Check a site configuration and turn it into Slurm configuration files.

    \b
    Examples:
      slurmbox config validate site-configs/hgx-h100-h200-spot.yaml
      slurmbox config render site-configs/hgx-h100-h200-spot.yaml --out /tmp/rendered
    """


@config.command("validate")
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (problems with path, line, message).")
def validate(file, as_json):
    """Validate FILE; exit 0 when valid, else 2 with one line per problem.

    Each problem line reads FILE:LINE: key.path: what is wrong and expected.

    \b
    Examples:
      slurmbox config validate /etc/slurmbox/site.yaml
      slurmbox config validate --json site.yaml | jq '.problems[].path'
    """
    site, _, err = _load(file)
    if err is not None:
        _fail(err, as_json)
    summary = {"file": file, "valid": True, "cluster": site.cluster, "node_groups": sorted(site.node_groups),
               "partitions": sorted(site.partitions), "profiles": sorted(site.profiles),
               "required_partitions": site.required_partitions()}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo("%s: valid: cluster %s, %d node groups, %d partitions (%s), %d profiles"
               % (file, site.cluster, len(site.node_groups), len(site.partitions),
                  ", ".join(site.partitions) or "none", len(site.profiles)))


@config.command("render")
@click.argument("file")
@click.option("--out", "out_dir", required=True, help="Directory to write the rendered files into (created).")
@click.option("--topology", "topology_file", default=None,
              help="topology.conf body to include (e.g. from 'slurmbox topology'); copied with a header.")
@click.option("--json", "as_json", is_flag=True, help="Print the written files and their sha256 as JSON.")
def render(file, out_dir, topology_file, as_json):
    """Render FILE into slurm-nodes.conf, gres.conf, cgroup.conf, plugstack.conf (and topology.conf).

    The output is deterministic (same input, same bytes) and every file starts
    with a header naming the source and its sha256. Add 'Include
    /etc/slurm/slurm-nodes.conf' to slurm.conf and deploy the others next to it.

    \b
    Examples:
      slurmbox config render site.yaml --out /tmp/rendered
      slurmbox config render site.yaml --out /etc/slurm --topology fabric-topology.conf
    """
    import hashlib

    from slurmbox.settings.render import RenderError, render_site, write_files

    site, raw, err = _load(file)
    if err is not None:
        _fail(err, as_json)
    topology = None
    if topology_file:
        try:
            with open(topology_file) as handle:
                topology = handle.read()
        except OSError as error:
            click.echo("%s: cannot read the topology file: %s" % (topology_file, error.strerror or error), err=True)
            sys.exit(EXIT_INVALID)
        except UnicodeDecodeError as error:
            click.echo("%s: not UTF-8 text (byte %d); pass a topology.conf body such as 'slurmbox topology "
                       "generate' writes" % (topology_file, error.start), err=True)
            sys.exit(EXIT_INVALID)
    try:
        files = render_site(site, file, raw, topology)
        paths = write_files(files, out_dir)
    except RenderError as error:
        click.echo("%s: %s" % (file, error), err=True)
        sys.exit(EXIT_INVALID)
    except OSError as error:
        raise click.ClickException("cannot write into %s: %s; pass --out a directory you can write (it is "
                                   "created if missing)" % (out_dir, error.strerror or error))
    if as_json:
        click.echo(json.dumps({"file": file, "out": os.path.abspath(out_dir),
                               "files": [{"path": p, "sha256": hashlib.sha256(files[os.path.basename(p)].encode())
                                          .hexdigest()} for p in paths]}, indent=2))
        return
    for path in paths:
        click.echo(path)


def _partition_line(name, p):
    every = "every %d s" % p["checkpoint_interval_s"] if p["checkpoint_interval_s"] else "on preemption only"
    return ("%s: sandbox %s, profile %s%s, %s, checkpoint %s (%s), restore fallback %s"
            % (name, p["sandbox"], p["default_profile"],
               " (allowed: %s)" % ", ".join(p["allowed_profiles"]) if p["allowed_profiles"] else "",
               "preemptible (spot)" if p["preemptible"] else "on-demand", p["checkpoint_mode"],
               every if p["checkpoint_mode"] != "none" else "off", p["restore_fallback"]))


@config.command("show")
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print the compiled JSON the supervisor caches.")
@click.option("--partition", default=None, help="Only this partition's compiled policy.")
def show(file, as_json, partition):
    """Print the compiled policy of FILE: what the step start path reads.

    Profiles (limits in MB and seconds), partition policies with checkpoint
    settings, the checkpoint store and the measurement policy.

    \b
    Examples:
      slurmbox config show site.yaml
      slurmbox config show site.yaml --partition spot --json
    """
    from slurmbox.settings.model import compile_site

    site, _, err = _load(file)
    if err is not None:
        _fail(err, as_json)
    data = compile_site(site).to_json()
    if partition is not None and partition not in data["partitions"]:
        click.echo("%s: no partition %r (partitions: %s)" % (file, partition, ", ".join(data["partitions"])),
                   err=True)
        sys.exit(EXIT_INVALID)
    if as_json:
        click.echo(json.dumps(data["partitions"][partition] if partition else data, indent=2, sort_keys=True))
        return
    names = [partition] if partition else list(data["partitions"])
    for name in names:
        click.echo(_partition_line(name, data["partitions"][name]))
    if partition:
        return
    for name, p in data["profiles"].items():
        limits = ", ".join("%s %s" % (k, v) for k, v in (("memory_limit_mb", p["memory_limit_mb"]),
                                                         ("pids_limit", p["pids_limit"]),
                                                         ("wall_limit_s", p["wall_limit_s"])) if v)
        click.echo("profile %s: network %s (allowed: %s), platform %s%s%s" % (
            name, p["network"], ", ".join(p["allowed_networks"]), p["platform"],
            ", unproxied devices allowed" if p["allow_unproxied_devices"] else "", ", " + limits if limits else ""))
    store = data["checkpoint_store"]
    click.echo("checkpoint store: %s, keep last %d, compression %s, min free %d MB"
               % (store["path"], store["keep_last"], store["compression"], store["min_free_mb"]))
    m = data["measurement"]
    click.echo("measurement: exclusive GPUs %s, clocks %s%s, harness CPUs %s, sandbox CPUs %s"
               % ("yes" if m["exclusive_gpus"] else "no", m["clock_policy"],
                  " at %d MHz" % m["locked_sm_clock_mhz"] if m["clock_policy"] == "locked" else "",
                  m["harness_cpus"] or "any", m["sandbox_cpus"] or "any"))
