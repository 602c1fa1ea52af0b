"""``slurmbox measure``: trusted timings of untrusted candidates, each in its own gVisor sandbox."""

import json
import os
import sys
import time

import click


def _cpus(value):
    if value is None:
        return None
    from slurmbox.measure.isolation import parse_cpu_list
    try:
        return parse_cpu_list(value)
    except ValueError:
        raise click.BadParameter("%r is not a CPU list such as 1 or 2-5,7" % value)


def _candidates(values):
    out = []
    for value in values:
        label, sep, path = value.partition("=")
        if not sep:
            label, path = os.path.splitext(os.path.basename(value))[0], value
        if not os.path.isfile(path):
            raise click.BadParameter("candidate file %s does not exist" % path, param_hint="--candidate")
        out.append((label, path))
    return out


def _gpu_index(path):
    import re
    match = re.search(r"nvidia(\d+)$", path)
    if not match or not os.path.exists(path):
        raise click.BadParameter("%s is not an NVIDIA device file such as /dev/nvidia0" % path, param_hint="--gpu")
    return int(match.group(1))


@click.group()
def measure():
    """Measure candidate programs inside sandboxes: timing statistics, a correctness
    verdict against a trusted reference, and flags with named reasons (any flag
    withholds the reward).

    \b
    Examples:
      slurmbox measure run --task matmul_task.py --candidate mine=cand.py --out c.h5
      slurmbox measure report c.h5
      slurmbox measure report old.h5 new.h5 --json
    """


@measure.command("run")
@click.option("--task", "task_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Trusted task file: make_inputs, reference, TIMING_SHAPE (see slurmbox.measure.task).")
@click.option("--candidate", "candidate_specs", multiple=True, required=True, metavar="[LABEL=]FILE.py",
              help="Candidate module defining run(**inputs); repeat for several.")
@click.option("--out", "out", default=None, type=click.Path(dir_okay=False),
              help="HDF5 record file (default: measure-TASK-UTCTIME.h5 in the current directory).")
@click.option("--json", "as_json", is_flag=True, help="Print the summaries as JSON.")
@click.option("--min-samples", default=10, show_default=True, type=click.IntRange(2, None))
@click.option("--min-time", default=0.5, show_default=True, type=click.FloatRange(0), help="Seconds of timed samples.")
@click.option("--max-noise", default=0.005, show_default=True, type=click.FloatRange(0),
              help="Stop at this relative standard deviation.")
@click.option("--max-wall", default=60.0, show_default=True, type=click.FloatRange(0.1),
              help="Seconds of sampling per candidate before reporting 'did not converge'.")
@click.option("--warmup", default=3, show_default=True, type=click.IntRange(0, None), help="Warm-up samples.")
@click.option("--harness-cpus", default=None, help="CPU list for the harness (default: site policy, else CPU 0).")
@click.option("--sandbox-cpus", default=None,
              help="CPU list for the candidate's sandbox (default: site policy, else the other CPUs).")
@click.option("--no-isolation", is_flag=True, help="Do not pin harness and sandbox to separate CPUs (comparison only).")
@click.option("--platform", default="auto", show_default=True, help="runsc platform (auto: systrap, else ptrace).")
@click.option("--site-config", default=None, type=click.Path(dir_okay=False),
              help="Site configuration whose 'measurement' policy applies (default /etc/slurmbox/site.yaml).")
@click.option("--fail-on-reject", is_flag=True, help="Exit with status 3 when any candidate is rejected.")
@click.option("--mode", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
              help="local: root starts runsc sandboxes on this node; slurm: each candidate is a sandboxed "
                   "Slurm step (srun --sandbox) of the current allocation, run as you.")
@click.option("--gpu", "gpu_files", multiple=True, metavar="/dev/nvidiaN",
              help="GPU device file to pass into each sandbox (runsc --nvproxy); repeatable. Clocks are locked "
                   "for the campaign when the site policy says clock_policy: locked.")
@click.option("--srun-arg", "srun_args", multiple=True, metavar="ARG",
              help="Extra srun option for --mode slurm (repeatable), e.g. --srun-arg=--exclusive.")
def run_cmd(task_path, candidate_specs, out, as_json, min_samples, min_time, max_noise, max_wall, warmup,
            harness_cpus, sandbox_cpus, no_isolation, platform, site_config, fail_on_reject, mode, gpu_files, srun_args):
    """Measure candidates of one task; write one HDF5 record file for the campaign.

    Local mode runs as root on the node (runsc needs it): each candidate gets its own
    runsc sandbox (no network, read-only root, unprivileged uid, its own
    CPUs); inputs come from a secret seed, fresh per sample; the reference
    runs in a separate trusted process; the harness's clock times a
    request/response handshake and the sandbox's cgroup CPU time is
    cross-checked. Slurm mode runs as the job's user inside an allocation:
    each candidate is a sandboxed step (srun --sandbox) whose stdin/stdout
    carry the channel; the step's cgroup CPU time is cross-checked when the
    step runs on the harness's node (a batch script; not under salloc on a
    login node, which the record says) and Slurm places the CPUs (see
    slurmbox/measure/slurm_step.py). Exit status 0 when the campaign was measured (rejected
    candidates included, unless --fail-on-reject), 1 on a harness error.

    \b
    Examples:
      slurmbox measure run --task tests/data/measure/matmul_task.py \\
          --candidate honest=tests/data/measure/honest.py --out campaign.h5
      slurmbox measure run --task t.py --candidate a.py --candidate b.py --sandbox-cpus 2-3 --json
      salloc -N1 --exclusive slurmbox measure run --mode slurm --task t.py --candidate a.py
    """
    from slurmbox.measure import campaign as campaign_mod, policy, report, stats
    from slurmbox.measure.harness import MeasureOptions

    candidates = _candidates(candidate_specs)
    if mode == "local" and os.geteuid() != 0:
        raise click.ClickException("slurmbox measure run needs root on this node (it starts runsc sandboxes and "
                                   "cgroups); run it with sudo or as a root-run Slurm prolog/step")
    rule = stats.StoppingRule(min_samples=min_samples, min_time=min_time, max_noise=max_noise, max_wall=max_wall,
                              warmup_samples=warmup)
    options = MeasureOptions(rule=rule, isolation=not no_isolation and mode == "local",
                             harness_cpus=_cpus(harness_cpus), sandbox_cpus=_cpus(sandbox_cpus), platform=platform,
                             sandbox="runsc" if mode == "local" else "slurm", srun_args=tuple(srun_args),
                             gpus=tuple(gpu_files), gpu_indices=tuple(_gpu_index(f) for f in gpu_files))
    if out is None:
        stem = os.path.splitext(os.path.basename(task_path))[0]
        out = "measure-%s-%s.h5" % (stem, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    campaign_mod.exit_on_sigterm()
    try:
        try:
            measurement_policy = policy.load(site_config)
        except OSError:
            if mode == "local":
                raise
            measurement_policy = {}  # Slurm mode as a user: Slurm places the step, not this policy
        result = campaign_mod.run_campaign(task_path, candidates, options, out=out,
                                           measurement_policy=measurement_policy)
    except Exception as err:  # every harness-side failure becomes one message, no traceback
        raise click.ClickException(_explain(err))
    if as_json:
        click.echo(json.dumps({"file": out, "task": result.task.name,
                               "overhead_ns": result.overhead.summary.get("median_ns") if result.overhead else None,
                               "candidates": [r.to_json() for r in result.results]}, indent=2))
    else:
        from slurmbox.measure import records
        click.echo(report.format_table(report.summary_rows(records.read_campaign(out))))
        if result.overhead:
            click.echo("harness overhead per sample (null candidate): %.4f ms" % (result.overhead.summary["median_ns"] / 1e6))
        for r in result.results:
            for flag in r.flags:
                click.echo("%s: %s (sample %d): %s" % (r.label, flag.reason, flag.sample, flag.detail[:300]))
        click.echo("record: %s" % out)
    if fail_on_reject and any(r.verdict != "accepted" for r in result.results):
        sys.exit(3)


def _explain(err):
    from slurmbox.measure import candidate_sandbox, isolation, records, reference, task
    known = (task.TaskError, isolation.IsolationError, candidate_sandbox.SandboxStartError,
             reference.ReferenceFailed, records.RecordError, ValueError, OSError)
    if isinstance(err, known):
        return str(err)
    return "unexpected %s: %s (please report this with the command line)" % (type(err).__name__, err)


@measure.command("report")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print rows (and the comparison) as JSON.")
def report_cmd(files, as_json):
    """Print a table of a campaign record; given two files, compare them.

    The comparison pairs candidates by label (or the only candidate of each
    file) and reports the ratio of medians with a bootstrap confidence
    interval, the Mann-Whitney U test and the Hodges-Lehmann shift, and warns
    when the two were measured under different conditions.

    \b
    Examples:
      slurmbox measure report campaign.h5
      slurmbox measure report baseline.h5 tuned.h5
      slurmbox measure report campaign.h5 --json | jq '.rows[] | {label, verdict, median_ns}'
    """
    from slurmbox.measure import records, report

    if len(files) > 2:
        raise click.UsageError("give one record file, or two to compare")
    try:
        campaigns = [records.read_campaign(path) for path in files]
    except records.RecordError as err:
        raise click.ClickException(str(err))
    rows = [row for c in campaigns for row in report.summary_rows(c)]
    comparison = report.compare_campaigns(campaigns[0], campaigns[1]) if len(campaigns) == 2 else None
    if as_json:
        data = {"rows": rows}
        if comparison is not None:
            data["comparison"] = comparison
        click.echo(json.dumps(data, indent=2))
        return
    for campaign in campaigns:
        click.echo("%s  (task %s, %s)" % (campaign["path"], campaign["task"], campaign["created_utc"]))
        click.echo(report.format_table(report.summary_rows(campaign)))
        click.echo("")
    if comparison is not None:
        click.echo(report.format_comparison(comparison, files[0], files[1]))


@measure.command("clocks")
@click.argument("action", type=click.Choice(["lock", "reset"]))
@click.option("--gpus", required=True, help="NVML device indices, e.g. 0 or 0-3.")
@click.option("--mhz", type=click.IntRange(min=0), default=None,
              help="SM clock to lock (default: the site policy's locked_sm_clock_mhz; 0 = default application clock).")
@click.option("--site-config", default=None, type=click.Path(dir_okay=False))
def clocks_cmd(action, gpus, mhz, site_config):
    """Lock or reset GPU SM clocks through NVML, for a root-run Slurm prolog/epilog.

    Never run inside a sandbox: candidates cannot change clocks. With
    'lock' and no --mhz, does nothing unless the site policy says
    clock_policy: locked.

    \b
    Examples (prolog / epilog, as root):
      slurmbox measure clocks lock --gpus "$CUDA_VISIBLE_DEVICES"
      slurmbox measure clocks reset --gpus 0-7
    """
    from slurmbox.measure import gpu, policy

    from slurmbox.measure.isolation import parse_cpu_list
    try:  # same list syntax as CPUs (cpuset(7))
        indices = sorted(parse_cpu_list(gpus.replace(" ", "")))
    except ValueError:
        indices = []
    if not indices:
        raise click.BadParameter("%r is not a list of NVML GPU indices such as 0 or 0-3" % gpus, param_hint="--gpus")
    try:
        if action == "reset":
            gpu.reset_clocks(indices)
            click.echo("reset SM clocks of GPU(s) %s" % ",".join(map(str, indices)))
            return
        settings = policy.load(site_config)
        if mhz is None:
            if settings["clock_policy"] != "locked":
                click.echo("site policy clock_policy is %r: clocks left alone" % settings["clock_policy"])
                return
            mhz = int(settings["locked_sm_clock_mhz"] or 0)
        locked = gpu.lock_clocks(indices, mhz)
    except (RuntimeError, OSError, ValueError) as err:
        raise click.ClickException(str(err))
    for index, value in sorted(locked.items()):
        click.echo("GPU %d: SM clock locked at %d MHz" % (index, value))
