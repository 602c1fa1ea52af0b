"""GPU exploits of issue 6 (10: side-stream work, persisting L2, uninitialised memory).

Real code for a node with an NVIDIA GPU, torch inside the harness's Python
environment and a runsc with --nvproxy; skipped otherwise, with the reason.
The GPU candidates are under tests/data/measure/gpu_*.py.
"""

import os
import shutil
import subprocess

import pytest

from slurmbox.measure import stats
from slurmbox.measure.harness import MeasureOptions



def _skip_reason():
    if os.geteuid() != 0 or not shutil.which("runsc"):
        return "needs root and runsc"
    if not os.path.exists("/dev/nvidia0"):
        return "no NVIDIA GPU on this machine (/dev/nvidia0 absent)"
    try:
        import torch
    except ImportError:
        return "torch is not installed in the harness's Python environment"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    flags = subprocess.run(["runsc", "flags"], capture_output=True, text=True).stdout
    if "nvproxy" not in flags:
        return "this runsc has no --nvproxy"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


@pytest.fixture(scope="module")
def run(measure_data):
    """Measure the named staged GPU candidates (files under tests/data/measure) in one campaign."""
    return lambda names, **changes: _run(measure_data, names, **changes)


def _run(data, names, **changes):
    from slurmbox.measure.campaign import run_campaign
    rule = stats.StoppingRule(min_samples=10, min_time=0.2, max_noise=0.005, max_wall=10.0, warmup_samples=3)
    options = MeasureOptions(rule=rule, gpus=("/dev/nvidia0",), gpu_indices=(0,), **changes)
    def path(name):
        return os.path.join(data, name + ".py")
    campaign = run_campaign(path("gpu_matmul_task"), [(n, path(n)) for n in names], options, measurement_policy={})
    return {r.label: r for r in campaign.results}


def test_gpu_honest_candidate_is_accepted(run):
    result = run(["gpu_honest"])["gpu_honest"]
    assert result.flags == [] and result.verdict == "accepted", result.flags
    assert result.sandbox_config["gpus"] == ["/dev/nvidia0"]


def test_exploit_10_side_stream_work_is_not_credited(run):
    results = run(["gpu_honest", "gpu_side_stream"])
    cheat, honest = results["gpu_side_stream"], results["gpu_honest"]
    # Either its output was copied before the side stream finished (wrong), or the clock saw the work.
    if cheat.verdict == "accepted":
        assert cheat.summary["median_ns"] >= 0.95 * honest.summary["median_ns"]  # it does 20x the work
    else:
        assert {"incorrect_output", "intermittent_incorrect"} & {f.reason for f in cheat.flags}
        assert cheat.reward_ns is None


def test_exploit_10_persisting_l2_gives_no_advantage(run):
    results = run(["gpu_plain_table", "gpu_l2_persist"])
    ratio = stats.compare(results["gpu_l2_persist"].samples["wall_ns"][results["gpu_l2_persist"].samples["kind"] == 1],
                          results["gpu_plain_table"].samples["wall_ns"][results["gpu_plain_table"].samples["kind"] == 1])
    assert ratio["ratio_ci"][0] > 0.95, ratio


def test_exploit_10_uninitialised_memory_is_flagged(run):
    cheat = run(["gpu_uninitialized"])["gpu_uninitialized"]
    assert {"incorrect_output", "nondeterministic_output"} & {f.reason for f in cheat.flags}
    assert cheat.reward_ns is None
