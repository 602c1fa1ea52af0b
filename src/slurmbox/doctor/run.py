"""Run every doctor check on one node and build the report."""

from slurmbox.doctor.context import gather
from slurmbox.doctor.device_checks import check_devices
from slurmbox.doctor.node_checks import check_node
from slurmbox.doctor.report import Check, FAIL, report
from slurmbox.doctor.runtime_checks import check_runtime


def run_checks(ctx):
    """[Check] of every group for NodeContext ``ctx``, runtime first. Never raises: a
    check that crashes is reported as a failure of that check."""
    checks = []
    for group, runner in (("runtime", check_runtime), ("devices", check_devices), ("node", check_node)):
        try:
            checks.extend(runner(ctx))
        except Exception as err:  # a bug in one group must not hide the others' results
            checks.append(Check("%s.internal" % group, group, FAIL, "the %s checks crashed: %s: %s"
                                % (group, type(err).__name__, err),
                                "report this as a slurmbox bug, with `slurmbox doctor --json` output"))
    return checks


def doctor(node=None, slurm_conf=None, site_config=None, gres_conf=None, probes=None):
    """(report dict, [Check]) for this node; arguments as slurmbox.doctor.context.gather."""
    ctx = gather(node, slurm_conf, site_config, gres_conf, probes)
    checks = run_checks(ctx)
    return report(ctx.node, checks), checks
