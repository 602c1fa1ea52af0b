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

Each line also shows the median share of the timed window the sandbox was
on a CPU (its cgroup CPU time over the window) and, per CPU, how busy the
CPU was and how much time the hypervisor stole (/proc/stat), so a noisy
figure can be told apart from a noisy machine.

Run as root: /opt/slurmbox/venv/bin/python benchmarks/measure_fidelity.py [--max-wall S] [--json]
The numbers depend on the machine; this script prints the CPU count because on
a 2-CPU machine "isolation" can only give the harness one CPU and the
candidate the other, and the neighbour must share the harness's CPU.
"""

import argparse
import atexit
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TASK_SOURCE = os.path.join(HERE, "measure_compute_task.py")
TASK = None  # a private copy of TASK_SOURCE, made by main(): the harness refuses task files a sandbox could read
CANDIDATE_SOURCE = os.path.join(HERE, "measure_compute_candidate.py")
CANDIDATE = CANDIDATE_SOURCE  # main() makes a private copy when --iterations changes the work per call
NEIGHBOUR = os.path.join(HERE, "measure_neighbour.py")


def cpu_times():
    """Per-CPU (busy, steal) jiffies from /proc/stat (proc(5): user nice system idle iowait irq softirq steal)."""
    out = {}
    with open("/proc/stat") as handle:
        for line in handle:
            if line.startswith("cpu") and line[3].isdigit():
                name, *values = line.split()
                v = [int(x) for x in values]
                out[int(name[3:])] = (v[0] + v[1] + v[2] + v[5] + v[6], v[7])
    return out


def measure(options, sandbox, label, calibrate=False):
    from slurmbox.measure.campaign import run_campaign
    opts = dataclasses.replace(options, sandbox=sandbox, calibrate=calibrate)
    before, started = cpu_times(), time.monotonic()
    campaign = run_campaign(TASK, [(label, CANDIDATE)], opts, measurement_policy={})
    after, elapsed = cpu_times(), time.monotonic() - started
    result = campaign.results[0]
    hz = os.sysconf("SC_CLK_TCK")
    result.diagnostics = {cpu: {"busy": (after[cpu][0] - before[cpu][0]) / hz / elapsed,
                                "steal": (after[cpu][1] - before[cpu][1]) / hz / elapsed} for cpu in after}
    if result.flags:
        print("  warning: %s flagged %s" % (label, sorted({f.reason for f in result.flags})), file=sys.stderr)
    return result, campaign.overhead


def line(name, result):
    s = result.summary
    timed = result.samples["kind"] == 1
    on_cpu = float(np.median(result.samples["cpu_ns"][timed] / result.samples["wall_ns"][timed]))
    diag = " ".join("cpu%d busy %3.0f%% steal %2.0f%%" % (c, 100 * d["busy"], 100 * d["steal"])
                    for c, d in sorted(result.diagnostics.items()))
    wall = result.samples["wall_ns"][timed]
    robust = 1.4826 * float(np.median(np.abs(wall - np.median(wall)))) / float(np.median(wall))
    return "  %-28s median %8.4f ms  rel sd %6.2f%% (MAD %5.2f%%)  n=%4d %-9s on-CPU %3.0f%% | %s" % (
        name, s["median_ns"] / 1e6, 100 * s["rel_stdev"], 100 * robust, s["count"],
        "converged" if result.converged else "NOT conv", 100 * on_cpu, diag)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-wall", type=float, default=8.0, help="seconds of sampling per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per figure")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument("--iterations", type=int, default=None,
                        help="logistic-map iterations per call (default: the task's 20000, ~22 ms here); the "
                             "task and candidate copies get this value")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("measure_fidelity: run as root (runsc sandboxes and cgroups)")
    from slurmbox.measure import isolation, stats
    from slurmbox.measure.campaign import exit_on_sigterm
    exit_on_sigterm()
    from slurmbox.measure.candidate_sandbox import SandboxedCandidate
    from slurmbox.measure.harness import MeasureOptions
    from slurmbox.measure.policy import default_cpus

    global TASK
    private = tempfile.mkdtemp(prefix="slurmbox-bench-task-")  # 0700, and /tmp is masked in sandboxes
    TASK = os.path.join(private, "measure_compute_task.py")
    shutil.copyfile(TASK_SOURCE, TASK)
    atexit.register(shutil.rmtree, private, True)
    if args.iterations:
        global CANDIDATE
        CANDIDATE = os.path.join(private, "measure_compute_candidate.py")
        for source, copy in ((TASK_SOURCE, TASK), (CANDIDATE_SOURCE, CANDIDATE)):
            with open(source) as handle:
                text = handle.read()
            with open(copy, "w") as handle:
                handle.write(text.replace("ITERATIONS = 20000", "ITERATIONS = %d" % args.iterations))

    harness_cpus, sandbox_cpus = default_cpus()
    rule = stats.StoppingRule(min_samples=20, min_time=1.0, max_noise=0.005, max_wall=args.max_wall, warmup_samples=5)
    on = MeasureOptions(rule=rule, isolation=True, harness_cpus=harness_cpus, sandbox_cpus=sandbox_cpus)
    off = dataclasses.replace(on, isolation=False)
    ncpu = len(isolation.online_cpus())
    print("slurmbox measure fidelity: %d CPUs online (harness %s, sandbox %s)%s"
          % (ncpu, isolation.format_cpu_list(harness_cpus), isolation.format_cpu_list(sandbox_cpus),
             "; NOTE: only 2 CPUs, the neighbour shares the harness's CPU under isolation" if ncpu <= 2 else ""))

    print("load average before: %s (other work on this shared machine shows as busy CPU time below)"
          % " ".join(open("/proc/loadavg").read().split()[:3]))
    print("Each figure alternates its two measurements over %d rounds (ABAB...) so that drift in the"
          " machine's load hits both alike; per round: a fresh sandbox, >= 20 samples, <= %.0f s." % (args.rounds, args.max_wall))
    print("1. bare vs sandboxed (isolation on, quiet node)")
    _, overhead = measure(on, "runsc", "sandboxed", calibrate=True)
    _, bare_overhead = measure(on, "bare", "bare", calibrate=True)
    bare, boxed, ratios = [], [], []
    for _ in range(args.rounds):
        bare.append(measure(on, "bare", "bare")[0])
        boxed.append(measure(on, "runsc", "sandboxed")[0])
        ratios.append(boxed[-1].summary["median_ns"] / bare[-1].summary["median_ns"])
    for name, results in (("bare (no sandbox)", bare), ("sandboxed (runsc %s)" % boxed[0].sandbox_config.get(
            "platform", "?"), boxed)):
        for result in results:
            print(line(name, result))
    ratio = float(np.median(ratios))
    print("  sandboxed/bare median ratio per round: %s -> median %.4f (goal 1.00 +/- 0.02)"
          % (", ".join("%.4f" % r for r in ratios), ratio))
    # The harness's own per-sample cost (null candidate: handshake and transfers) differs between a
    # sandboxed runner (its socket calls go through gVisor) and a bare one; without it, what is left
    # is the candidate's compute as each mode timed it.
    box_over, bare_over = overhead.summary["median_ns"], bare_overhead.summary["median_ns"]
    net = [(b.summary["median_ns"] - box_over) / (a.summary["median_ns"] - bare_over) for a, b in zip(bare, boxed)]
    print("  same without each mode's harness overhead (null candidate: sandboxed %.3f ms, bare %.3f ms): %s -> "
          "median %.4f" % (box_over / 1e6, bare_over / 1e6, ", ".join("%.4f" % r for r in net),
                           float(np.median(net))))
    print("  rel stdev, median over rounds: bare %.3f%%, sandboxed %.3f%% (goal <= 0.5%% in both)"
          % (100 * np.median([r.summary["rel_stdev"] for r in bare]),
             100 * np.median([r.summary["rel_stdev"] for r in boxed])))

    print("2. noisy neighbour (a runsc sandbox hammering CPU and memory bandwidth)")
    shifts = {}
    for name, options in (("isolation on", on), ("isolation off", off)):
        neighbour_cpus = harness_cpus if options.isolation else None
        round_shifts = []
        for _ in range(args.rounds):
            quiet, _ = measure(options, "runsc", "quiet")
            with SandboxedCandidate(NEIGHBOUR, "neighbour", cpus=neighbour_cpus, priority=False):
                noisy, _ = measure(options, "runsc", "noisy")
            round_shifts.append(noisy.summary["median_ns"] / quiet.summary["median_ns"] - 1)
            print(line("%s, quiet" % name, quiet))
            print(line("%s, neighbour" % name, noisy))
        shifts[name] = float(np.median(round_shifts))
        print("  %-40s median shift per round %s -> median %+.2f%%" % (
            name, ", ".join("%+.2f%%" % (100 * x) for x in round_shifts), 100 * shifts[name]))
    print("  side by side: shift with isolation on %+.2f%% (goal within 2%%), off %+.2f%%"
          % (100 * shifts["isolation on"], 100 * shifts["isolation off"]))

    print("3. harness overhead per sample")
    over = overhead.summary["median_ns"]
    print("  null candidate (handshake + transfers) median %.4f ms = %.2f%% of the candidate's %.4f ms"
          % (over / 1e6, 100 * over / boxed[0].summary["median_ns"], boxed[0].summary["median_ns"] / 1e6))
    print("  bare runner's null candidate %.4f ms: the sandbox adds %.4f ms per sample"
          % (bare_over / 1e6, (over - bare_over) / 1e6))
    if args.json:
        print(json.dumps({"cpus": ncpu, "bare": [r.summary for r in bare], "sandboxed": [r.summary for r in boxed],
                          "ratios": ratios, "ratio": ratio, "net_ratios": net, "neighbour_shift": shifts,
                          "overhead_ns": over, "bare_overhead_ns": bare_over},
                         indent=1))


if __name__ == "__main__":
    main()
