"""Fidelity of slurmbox measure (issue 6), measured side by side in one run.

Prints:
1. a compute-bound CPU candidate measured bare (same runner and handshake,
   no sandbox) and inside the runsc sandbox: ratio of medians, relative
   stdev of each;
2. the same sandboxed candidate with a noisy neighbour (another runsc
   sandbox hammering CPU and memory bandwidth), isolation on vs off: median
   shift against the quiet run of the same isolation setting;
3. the harness's overhead per sample (the trusted null candidate) against the
   candidate's own time.

Run as root: /opt/slurmbox/venv/bin/python benchmarks/measure_fidelity.py [--max-wall S] [--json]
The numbers depend on the machine; this script prints the CPU count because on
a 2-CPU machine "isolation" can only give the harness one CPU and the
candidate the other, and the neighbour must share the harness's CPU.
"""

import argparse
import dataclasses
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TASK = os.path.join(HERE, "measure_compute_task.py")
CANDIDATE = os.path.join(HERE, "measure_compute_candidate.py")
NEIGHBOUR = os.path.join(HERE, "measure_neighbour.py")


def measure(options, sandbox, label, calibrate=False):
    from slurmbox.measure.campaign import run_campaign
    opts = dataclasses.replace(options, sandbox=sandbox, calibrate=calibrate)
    campaign = run_campaign(TASK, [(label, CANDIDATE)], opts, measurement_policy={})
    result = campaign.results[0]
    if result.flags:
        print("  warning: %s flagged %s" % (label, sorted({f.reason for f in result.flags})), file=sys.stderr)
    return result, campaign.overhead


def line(name, result):
    s = result.summary
    return "  %-40s median %9.4f ms  rel stdev %6.3f%%  n=%4d  %s" % (
        name, s["median_ns"] / 1e6, 100 * s["rel_stdev"], s["count"],
        "converged" if result.converged else "did NOT converge")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-wall", type=float, default=20.0, help="seconds of sampling per measurement")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("measure_fidelity: run as root (runsc sandboxes and cgroups)")
    from slurmbox.measure import isolation, stats
    from slurmbox.measure.candidate_sandbox import SandboxedCandidate
    from slurmbox.measure.harness import MeasureOptions
    from slurmbox.measure.policy import default_cpus

    harness_cpus, sandbox_cpus = default_cpus()
    rule = stats.StoppingRule(min_samples=20, min_time=1.0, max_noise=0.005, max_wall=args.max_wall, warmup_samples=5)
    on = MeasureOptions(rule=rule, isolation=True, harness_cpus=harness_cpus, sandbox_cpus=sandbox_cpus)
    off = dataclasses.replace(on, isolation=False)
    ncpu = len(isolation.online_cpus())
    print("slurmbox measure fidelity: %d CPUs online (harness %s, sandbox %s)%s"
          % (ncpu, isolation.format_cpu_list(harness_cpus), isolation.format_cpu_list(sandbox_cpus),
             "; NOTE: only 2 CPUs, the neighbour shares the harness's CPU under isolation" if ncpu <= 2 else ""))

    print("1. bare vs sandboxed (isolation on, quiet node)")
    bare, _ = measure(on, "bare", "bare")
    boxed, overhead = measure(on, "runsc", "sandboxed", calibrate=True)
    print(line("bare (no sandbox)", bare))
    print(line("sandboxed (runsc %s)" % boxed.sandbox_config.get("platform", "?"), boxed))
    cmp_box = stats.compare(boxed.samples["wall_ns"][boxed.samples["kind"] == 1],
                            bare.samples["wall_ns"][bare.samples["kind"] == 1])
    print("  median ratio sandboxed/bare %.4f (95%% CI %.4f-%.4f; goal 1.00 +/- 0.02)"
          % (cmp_box["median_ratio"], *cmp_box["ratio_ci"]))

    print("2. noisy neighbour (a runsc sandbox hammering CPU and memory bandwidth)")
    shifts = {}
    for name, options in (("isolation on", on), ("isolation off", off)):
        quiet, _ = measure(options, "runsc", "quiet")
        neighbour_cpus = harness_cpus if options.isolation else None
        with SandboxedCandidate(NEIGHBOUR, "neighbour", cpus=neighbour_cpus):
            noisy, _ = measure(options, "runsc", "noisy")
        shift = noisy.summary["median_ns"] / quiet.summary["median_ns"] - 1
        shifts[name] = {"quiet": quiet.summary, "noisy": noisy.summary, "shift": shift,
                        "quiet_converged": quiet.converged, "noisy_converged": noisy.converged}
        print(line("%s, quiet" % name, quiet))
        print(line("%s, neighbour" % name, noisy))
        print("  %-40s median shift %+.2f%% (goal with isolation: within 2%%)" % (name, 100 * shift))

    print("3. harness overhead per sample")
    over = overhead.summary["median_ns"]
    print("  null candidate (handshake + transfers) median %.4f ms = %.2f%% of the candidate's %.4f ms"
          % (over / 1e6, 100 * over / boxed.summary["median_ns"], boxed.summary["median_ns"] / 1e6))
    if args.json:
        print(json.dumps({"cpus": ncpu, "bare": bare.summary, "sandboxed": boxed.summary,
                          "ratio": cmp_box, "neighbour": shifts, "overhead_ns": over}, indent=1))


if __name__ == "__main__":
    main()
