"""``slurmbox config``: validate a site configuration and render the Slurm files from it."""

import json
import os
import sys

import click

#: Exit status for an invalid configuration (as click uses for usage errors).
EXIT_INVALID = 2


def _load(path):
    """(SiteModel, raw bytes) of ``path``; prints the problems and exits 2 when invalid."""
    from slurmbox.site_config.model import SiteConfigError, load_site

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

    from slurmbox.site_config.render import RenderError, render_site, write_files

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
    try:
        files = render_site(site, file, raw, topology)
        paths = write_files(files, out_dir)
    except RenderError as error:
        click.echo("%s: %s" % (file, error), err=True)
        sys.exit(EXIT_INVALID)
    except OSError as error:
        raise click.ClickException("cannot write into %s: %s" % (out_dir, error.strerror or error))
    if as_json:
        click.echo(json.dumps({"file": file, "out": os.path.abspath(out_dir),
                               "files": [{"path": p, "sha256": hashlib.sha256(files[os.path.basename(p)].encode())
                                          .hexdigest()} for p in paths]}, indent=2))
        return
    for path in paths:
        click.echo(path)
