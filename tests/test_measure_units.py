"""Unit tests of slurmbox.measure: channel framing, statistics, output checks, CPU
cross-checks, records, report and CLI. No sandbox needed."""

import json
import os
import socket
import struct
import types

import numpy as np
import pytest
from click.testing import CliRunner

from slurmbox.measure import checks, harness, isolation, policy, protocol, records, stats, task

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "measure")


# ---- protocol ---------------------------------------------------------------------------------

def test_protocol_round_trip_keeps_names_dtypes_shapes_and_values():
    a, b = socket.socketpair()
    arrays = [("x", np.arange(12, dtype=np.float32).reshape(3, 4)), ("flags", np.array([True, False])),
              ("empty", np.zeros((0, 5)))]
    protocol.send(a, {"op": "run", "id": 7}, arrays)
    header = protocol.recv_header(b)
    got = protocol.recv_arrays(b, header, 1 << 20)
    assert header["op"] == "run" and header["id"] == 7
    assert [n for n, _ in got] == ["x", "flags", "empty"]
    for (_, want), (_, have) in zip(arrays, got):
        assert have.dtype == want.dtype and have.shape == want.shape and np.array_equal(have, want)


def test_protocol_refuses_object_arrays_on_send():
    a, _ = socket.socketpair()
    with pytest.raises(protocol.ProtocolError, match="not allowed"):
        protocol.send(a, {"op": "result"}, [("o", np.array([object()]))])


def _raw(sock, header):
    body = json.dumps(header).encode()
    sock.sendall(struct.pack("!I", len(body)) + body)


@pytest.mark.parametrize("header,match", [
    ({"op": "result", "arrays": [{"name": "o", "dtype": "|O", "shape": [1]}]}, "allowed dtype"),
    ({"op": "result", "arrays": [{"name": "o", "dtype": "<f8", "shape": [-1]}]}, "invalid shape"),
    ({"op": "result", "arrays": [{"name": "o", "dtype": "<f8", "shape": [1] * 9}]}, "invalid shape"),
    ({"arrays": []}, "string 'op'"),
])
def test_protocol_rejects_malformed_headers(header, match):
    a, b = socket.socketpair()
    _raw(a, header)
    with pytest.raises(protocol.ProtocolError, match=match):
        protocol.recv_header(b)


def test_protocol_rejects_oversized_payload_and_header():
    a, b = socket.socketpair()
    _raw(a, {"op": "result", "arrays": [{"name": "o", "dtype": "<f8", "shape": [1000, 1000]}]})
    header = protocol.recv_header(b)
    with pytest.raises(protocol.ProtocolError, match="exceeds the limit"):
        protocol.recv_arrays(b, header, 1024)
    a.sendall(struct.pack("!I", protocol.MAX_HEADER + 1))
    with pytest.raises(protocol.ProtocolError, match="outside"):
        protocol.recv_header(b)


def test_protocol_reports_a_closed_peer():
    a, b = socket.socketpair()
    a.sendall(b"\x00\x00")
    a.close()
    with pytest.raises(protocol.PeerClosed):
        protocol.recv_header(b)


# ---- statistics -------------------------------------------------------------------------------

def test_summarize_gives_median_iqr_and_outliers():
    values = [10.0] * 5 + [11.0] * 5 + [100.0]
    s = stats.summarize(values)
    assert s["count"] == 11 and s["median_ns"] == 11.0
    assert s["q1_ns"] == 10.0 and s["q3_ns"] == 11.0 and s["iqr_ns"] == 1.0
    assert s["outliers"] == 1
    assert stats.summarize([])["count"] == 0


def test_stopping_rule_needs_samples_time_and_low_noise():
    rule = stats.StoppingRule(min_samples=10, min_time=0.001, max_noise=0.005, max_wall=5)
    steady = [1_000_000] * 10
    assert rule.done(steady[:9], 0.1) == (False, False)
    assert rule.done(steady, 0.1) == (True, True)
    noisy = [1_000_000, 1_100_000] * 5
    assert rule.done(noisy, 0.1) == (False, False)
    assert rule.done(noisy, 5.0) == (True, False)  # wall cap: stops, did not converge
    assert stats.StoppingRule(min_time=10).done(steady, 0.1) == (False, False)


def test_compare_finds_a_real_difference_and_not_a_fake_one():
    rng = np.random.default_rng(1)
    a = rng.normal(100, 1, 50)
    b = rng.normal(110, 1, 50)
    result = stats.compare(a, b)
    assert result["significant"] and result["median_ratio"] < 1
    assert result["ratio_ci"][0] <= result["median_ratio"] <= result["ratio_ci"][1] < 1
    assert result["hodges_lehmann_ns"] == pytest.approx(-10, abs=1)
    same = stats.compare(rng.normal(100, 1, 50), rng.normal(100, 1, 50))
    assert not same["significant"] and same["ratio_ci"][0] < 1 < same["ratio_ci"][1]
    with pytest.raises(ValueError, match="at least 2"):
        stats.compare([1.0], [1.0, 2.0])


# ---- output checks ----------------------------------------------------------------------------

def _task(**kw):
    base = dict(path="t.py", name="t", timing_shape=(4,), make_inputs=None, reference=None, rtol=1e-9, atol=1e-9)
    base.update(kw)
    return task.Task(**base)


def _reasons(flags):
    return {f.reason for f in flags}


def test_verify_output_accepts_a_correct_answer():
    x = np.array([3.0, 1.0, 2.0])
    assert checks.verify_output(np.sort(x), np.sort(x), {"x": x}, _task(), checks.OutputHistory(), 0) == []


def test_verify_output_names_each_cheat():
    x = np.array([3.0, 1.0, 2.0, 5.0])
    expected = np.sort(x)
    history = checks.OutputHistory()
    history.add(np.array([9.0, 8.0, 7.0, 6.0]))
    t = _task()
    assert "stale_output" in _reasons(checks.verify_output(np.array([9.0, 8.0, 7.0, 6.0]), expected, {"x": x}, t,
                                                           history, 1))
    assert "identity_output" in _reasons(checks.verify_output(x.copy(), expected, {"x": x}, t, history, 1))
    assert "constant_output" in _reasons(checks.verify_output(np.zeros(4), expected, {"x": x}, t, history, 1))
    assert "tolerance_exceeded" in _reasons(checks.verify_output(expected * (1 + 1e-4), expected, {"x": x}, t,
                                                                 history, 1))
    assert _reasons(checks.verify_output(np.zeros(3), expected, {"x": x}, t, history, 1)) == {"wrong_output_shape"}
    bad = expected.copy()
    bad[0] = np.nan
    assert "non_finite_output" in _reasons(checks.verify_output(bad, expected, {"x": x}, t, history, 1))


def test_weak_task_check_still_catches_degenerate_answers():
    weak = _task(check=lambda out, exp, inputs: (True, "anything goes"))
    x = np.array([3.0, 1.0, 2.0, 5.0])
    flags = checks.verify_output(x.copy(), np.sort(x), {"x": x}, weak, checks.OutputHistory(), 0)
    assert _reasons(flags) == {"identity_output"}


def test_forged_lines_match_harness_like_text_only():
    text = "computing rows\nslurmbox: verdict accepted\n{\"median_ns\": 1}\nhello timer\n"
    assert checks.forged_lines(text) == ["slurmbox: verdict accepted", '{"median_ns": 1}']


def test_cpu_flags_catch_busy_quiet_windows_and_impossible_cpu_time():
    th = checks.CpuThresholds(idle_rate=0.001)
    assert checks.cpu_flags(0, 10_000_000, 9_000_000, 5_000_000, 100_000, 1, th) == []
    assert _reasons(checks.cpu_flags(0, 10_000_000, 9_000_000, 5_000_000, 4_900_000, 1, th)) == {"work_after_done"}
    assert _reasons(checks.cpu_flags(0, 10_000_000, 25_000_000, 0, None, 1, th)) == {"cpu_exceeds_wall"}
    assert checks.cpu_flags(0, 10_000_000, 19_000_000, 0, None, 2, th) == []


def test_claim_flags_use_medians_against_the_overhead():
    rows = [{"kind": 1, "claimed_ns": 9_000_000, "wall_ns": 10_000_000}] * 5
    assert harness._claim_flags(rows, 500_000) == []
    forged = [{"kind": 1, "claimed_ns": 1, "wall_ns": 10_000_000}] * 5
    assert _reasons(harness._claim_flags(forged, 500_000)) == {"timing_claim_mismatch"}
    inflated = [{"kind": 1, "claimed_ns": 50_000_000, "wall_ns": 10_000_000}] * 5
    assert _reasons(harness._claim_flags(inflated, None)) == {"timing_claim_mismatch"}


# ---- cpu lists, tasks, policy -----------------------------------------------------------------

def test_cpu_list_round_trip():
    assert isolation.parse_cpu_list("0-2,5") == {0, 1, 2, 5}
    assert isolation.format_cpu_list({0, 1, 2, 5}) == "0-2,5"
    with pytest.raises(ValueError):
        isolation.parse_cpu_list("a-b")


def test_validate_cpus_names_the_missing_cpus():
    with pytest.raises(isolation.IsolationError, match="9999"):
        isolation.validate_cpus({9999}, "sandbox")


def test_load_task_imports_a_file_whatever_its_name_and_reports_one_that_is_not_python(tmp_path):
    named = tmp_path / "matmul.task"
    named.write_bytes(open(os.path.join(DATA, "matmul_task.py"), "rb").read())
    assert task.load_task(str(named)).name == "matmul"
    binary = tmp_path / "task.bin"
    binary.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(task.TaskError, match="fails to import"):
        task.load_task(str(binary))


def test_load_task_reports_missing_names(tmp_path):
    bad = tmp_path / "bad_task.py"
    bad.write_text("def reference(x):\n    return x\n")
    with pytest.raises(task.TaskError, match="TIMING_SHAPE, make_inputs"):
        task.load_task(str(bad))
    with pytest.raises(task.TaskError, match="does not exist"):
        task.load_task(str(tmp_path / "none.py"))
    good = task.load_task(os.path.join(DATA, "matmul_task.py"))
    assert good.name == "matmul" and good.timing_shape == (128, 128) and good.hidden_shape is not None


def test_policy_reads_measurement_fields_with_defaults(monkeypatch, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("x: 1\n")
    fake = types.SimpleNamespace(measurement=types.SimpleNamespace(harness_cpus="0", sandbox_cpus=[1, 2],
                                                                   clock_policy="locked"))
    import slurmbox.settings.compiled as compiled
    monkeypatch.setattr(compiled, "load_policy", lambda path, cache: fake)
    loaded = policy.load(str(site), str(tmp_path))
    assert loaded["harness_cpus"] == {0} and loaded["sandbox_cpus"] == {1, 2}
    assert loaded["clock_policy"] == "locked" and loaded["exclusive_gpus"] is True
    monkeypatch.setattr(compiled, "load_policy", lambda path, cache: types.SimpleNamespace())
    assert policy.load(str(site), str(tmp_path))["sandbox_cpus"] is None


# ---- records, report, CLI ---------------------------------------------------------------------

def _result(label, median, flags=(), n=30, node="n1"):
    rng = np.random.default_rng(abs(hash(label)) % 1000)
    wall = rng.normal(median, median * 0.01, n).astype(np.int64)
    samples = {"kind": np.array([0, 0] + [1] * (n - 2), dtype=np.int8), "wall_ns": wall,
               "cpu_ns": wall - 10, "quiet_wall_ns": np.full(n, 2_000_000), "quiet_cpu_ns": np.full(n, 1000),
               "claimed_ns": wall - 100, "correct": np.ones(n, dtype=np.int8)}
    summary = stats.summarize(wall[2:])
    flag_objs = [checks.Flag(r, 3, "detail") for r in flags]
    return harness.CandidateResult(
        label=label, candidate_path="/c/%s.py" % label, candidate_sha256="0" * 64, task_name="t", samples=samples,
        summary=summary, converged=True, flags=flag_objs, verdict="rejected" if flags else "accepted",
        reward_ns=None if flags else summary["median_ns"],
        fingerprint={"node": node, "cpu_model": "cpu", "sandbox_cpus": "1", "harness_cpus": "0",
                     "gpu": {"present": False, "devices": []}},
        sandbox_config={"runtime": "runsc", "platform": "ptrace"}, stdout="", stderr="", overhead_ns=300_000.0)


def _write(path, results):
    t = task.Task(path="/t.py", name="t", timing_shape=(1,), make_inputs=None, reference=None)
    records.write_campaign(str(path), t, results, "ab" * 32)


def test_records_never_write_through_a_symlink_planted_in_the_directory(tmp_path):
    """The root-run harness often writes its record into a directory others can write: a
    symlink at the record's name or at the old fixed temporary name must not redirect it."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "c.h5"
    os.symlink(str(victim), str(path) + ".tmp")
    os.symlink(str(victim), str(path))
    _write(path, [_result("fast", 1_000_000)])
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and records.read_campaign(str(path))["candidates"][0]["label"] == "fast"
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5", "c.h5.tmp", "victim"]


def test_records_round_trip(tmp_path):
    path = tmp_path / "c.h5"
    _write(path, [_result("fast", 1_000_000), _result("cheat", 500_000, flags=["stale_output"])])
    data = records.read_campaign(str(path))
    by = {c["label"]: c for c in data["candidates"]}
    assert by["fast"]["verdict"] == "accepted" and by["fast"]["reward_ns"] == pytest.approx(
        by["fast"]["summary"]["median_ns"])
    assert by["cheat"]["reward_ns"] is None and by["cheat"]["flag_reasons"] == ["stale_output"]
    assert by["fast"]["fingerprint"]["node"] == "n1" and by["fast"]["sandbox"]["platform"] == "ptrace"
    assert len(by["fast"]["samples"]["wall_ns"]) == 30
    assert not os.path.exists(str(path) + ".tmp")


def test_report_table_and_comparison(tmp_path):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    _write(a, [_result("k", 1_000_000)])
    _write(b, [_result("k", 1_200_000, node="n2")])
    runner = CliRunner()
    from slurmbox.cli.measure_cmd import measure
    shown = runner.invoke(measure, ["report", str(a), str(b)])
    assert shown.exit_code == 0, shown.output
    assert "median_ms" in shown.output and "k (A) vs k (B)" in shown.output and "A faster" in shown.output
    assert "different conditions: node" in shown.output
    as_json = runner.invoke(measure, ["report", str(a), str(b), "--json"])
    data = json.loads(as_json.output)
    assert data["comparison"][0]["median_ratio"] == pytest.approx(1 / 1.2, rel=0.02)
    assert data["comparison"][0]["significant"] is True
    assert {r["label"] for r in data["rows"]} == {"k"}


def test_report_refuses_a_file_that_is_not_a_record(tmp_path):
    bogus = tmp_path / "x.h5"
    bogus.write_text("not hdf5")
    from slurmbox.cli.measure_cmd import measure
    result = CliRunner().invoke(measure, ["report", str(bogus)])
    assert result.exit_code == 1
    assert "not a readable HDF5 file" in result.output and "Traceback" not in result.output


def test_run_refuses_a_missing_candidate_file(tmp_path):
    from slurmbox.cli.measure_cmd import measure
    result = CliRunner().invoke(measure, ["run", "--task", os.path.join(DATA, "matmul_task.py"),
                                          "--candidate", str(tmp_path / "nope.py")])
    assert result.exit_code == 2 and "does not exist" in result.output


@pytest.mark.parametrize("args", [["reset", "--gpus", "GPU-1a2b"], ["reset", "--gpus", ""],
                                  ["lock", "--gpus", "0", "--mhz", "-5"]])
def test_clocks_refuses_what_is_not_gpu_indices_or_a_clock(args):
    from slurmbox.cli.measure_cmd import measure
    result = CliRunner().invoke(measure, ["clocks", *args])
    assert result.exit_code == 2 and "CPU" not in result.output and "Traceback" not in result.output
    assert ("--gpus" in result.output) != ("--mhz" in result.output)


# ---- NVML interface (a fake pynvml shaped like nvidia-ml-py; values as an H100 SXM reports them) ----

class _FakeNvml(types.ModuleType):
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_CLOCK_GRAPHICS = 1, 2, 0

    def __init__(self, throttle=0):
        super().__init__("pynvml")
        self.throttle = throttle
        self.locked = {}
        self.shutdowns = 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetUUID(self, handle):
        return "GPU-2b7c3c1e-9d7e-5a0b-8f0c-3f2f4d1e6a77"

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetClockInfo(self, handle, which):
        return {1: 1980, 2: 2619}[which]

    def nvmlDeviceGetEccMode(self, handle):
        return (1, 1)

    def nvmlDeviceGetMigMode(self, handle):
        return (0, 0)

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return 700000

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self.throttle

    def nvmlDeviceGetDefaultApplicationsClock(self, handle, which):
        return 1755

    def nvmlDeviceSetGpuLockedClocks(self, handle, low, high):
        self.locked[handle[1]] = (low, high)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [types.SimpleNamespace(pid=4242, usedGpuMemory=1 << 30)]


def test_gpu_fingerprint_throttle_and_clock_lock_through_nvml(monkeypatch):
    import sys

    from slurmbox.measure import gpu
    fake = _FakeNvml(throttle=0x1 | 0x40)  # idle (ignored) + sw_thermal
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    fp = gpu.fingerprint()
    device = fp["devices"][0]
    assert fp["present"] and device["uuid"].startswith("GPU-") and device["driver"] == "550.54.15"
    assert device["sm_clock_mhz"] == 1980 and device["ecc"] == 1 and device["mig"] == 0
    assert device["power_limit_w"] == 700.0
    monitor = gpu.ThrottleMonitor((0,))
    assert monitor.read() == 0x40 and monitor.histogram == {"sw_thermal": 1}
    assert monitor.last_sm_mhz == 1980
    monitor.close()
    assert gpu.lock_clocks([0], 0) == {0: 1755} and fake.locked[0] == (1755, 1755)
    assert gpu.foreign_processes([0]) == {0: [4242]}


def test_campaign_refuses_gpus_in_use_when_the_site_wants_them_exclusive(monkeypatch, measure_data):
    import sys

    from slurmbox.measure import campaign
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    options = harness.MeasureOptions(gpus=("/dev/nvidia0",), gpu_indices=(0,), isolation=False)
    with pytest.raises(isolation.IsolationError, match="GPU 0: pids \\[4242\\]"):
        campaign.run_campaign(os.path.join(measure_data, "matmul_task.py"), [("h", os.path.join(DATA, "honest.py"))],
                              options, measurement_policy={"exclusive_gpus": True})


def test_gpu_reports_not_present_without_nvidia_ml_py(monkeypatch):
    import sys

    from slurmbox.measure import gpu
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert gpu.fingerprint() == {"present": False, "reason": "nvidia-ml-py is not installed", "devices": []}
    assert gpu.ThrottleMonitor(()).read() == 0
    with pytest.raises(RuntimeError, match="not installed"):
        gpu.lock_clocks([0], 1000)


def test_harness_connects_only_to_a_socket_the_candidate_uid_owns(tmp_path):
    from slurmbox.measure.candidate_sandbox import SandboxedCandidate, SandboxStartError
    candidate = SandboxedCandidate(os.path.join(DATA, "honest.py"), "t", uid=os.getuid(), gid=os.getgid())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    real = str(tmp_path / "real.sock")
    listener.bind(real)
    listener.listen(1)
    conn = candidate._connect_socket(real)
    assert conn is not None
    conn.close()
    os.symlink(real, str(tmp_path / "sock"))
    with pytest.raises(SandboxStartError, match="symlink"):
        candidate._connect_socket(str(tmp_path / "sock"))
    assert candidate._connect_socket(str(tmp_path / "absent")) is None


def test_probe_schedule_is_secret_distinct_and_leaves_room_for_a_repeat():
    rng = np.random.default_rng(3)
    for _ in range(50):
        hidden = harness._schedule(rng, 2, 10)
        repeats = harness._schedule(rng, 1, 10, first=2, taken=hidden)
        assert len(hidden) == 2 and len(repeats) == 1
        assert not hidden & repeats and min(repeats) >= 2 and max(hidden | repeats) < 10


def test_task_files_the_sandbox_could_read_are_refused(measure_data):
    from slurmbox.measure import campaign
    assert not campaign.visible_in_sandbox(os.path.join(measure_data, "matmul_task.py"), 65534, 65534)  # 0700 dir
    assert campaign.visible_in_sandbox("/etc/hostname", 65534, 65534)
    options = harness.MeasureOptions()
    with pytest.raises(ValueError, match="readable inside"):
        campaign.run_campaign("/etc/hostname", [("h", os.path.join(DATA, "honest.py"))], options,
                              measurement_policy={})


def test_root_refuses_a_task_file_another_user_could_change(tmp_path):
    """Root imports the task (and the reference process imports it again): a file or directory
    that another user may change would run that user's code as root."""
    from slurmbox.measure import campaign
    if os.geteuid() != 0:
        pytest.skip("the check applies to a root-run harness")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    task_file = private / "task.py"
    task_file.write_bytes(open(os.path.join(DATA, "matmul_task.py"), "rb").read())
    assert campaign.changeable_by_others(str(task_file)) is None
    os.chmod(str(private), 0o777)
    assert campaign.changeable_by_others(str(task_file)) == str(private)
    os.chmod(str(private), 0o700)
    os.chown(str(task_file), 65534, 65534)
    assert campaign.changeable_by_others(str(task_file)) == str(task_file)
    link = tmp_path / "link.py"
    os.symlink(str(task_file), str(link))
    with pytest.raises(ValueError, match="can be changed by a user other than root"):
        campaign.run_campaign(str(link), [("h", os.path.join(DATA, "honest.py"))], harness.MeasureOptions(),
                              measurement_policy={})


def test_slurm_mode_refuses_task_files_its_steps_could_read():
    """A Slurm-mode candidate runs as the harness's own user: only the sandbox's masked
    directories hide the task file from it, so a task outside them is refused too."""
    from slurmbox.measure import campaign
    options = harness.MeasureOptions(sandbox="slurm")
    with pytest.raises(ValueError, match="readable inside"):
        campaign.run_campaign("/etc/hostname", [("h", os.path.join(DATA, "honest.py"))], options,
                              measurement_policy={})


def test_candidate_sandbox_has_a_memory_limit():
    from slurmbox.measure.candidate_sandbox import MEMORY_LIMIT_MB, SandboxedCandidate
    default = SandboxedCandidate(os.path.join(DATA, "honest.py"), "t").build_spec()
    assert default["linux"]["resources"]["memory"] == {"limit": MEMORY_LIMIT_MB * 1024 * 1024}
    small = SandboxedCandidate(os.path.join(DATA, "honest.py"), "t", memory_limit_mb=256).build_spec()
    assert small["linux"]["resources"]["memory"] == {"limit": 256 * 1024 * 1024}
    unlimited = SandboxedCandidate(os.path.join(DATA, "honest.py"), "t", memory_limit_mb=0).build_spec()
    assert "memory" not in unlimited["linux"]["resources"]


def test_stale_candidate_cgroups_are_removed_and_live_ones_kept():
    """A harness killed with SIGKILL leaves its candidate's cgroup; the next one removes it
    once it holds no process, and never a cgroup that still holds one."""
    import subprocess
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroups")
    parent = "slurmbox-measure-shared"
    try:
        isolation.prepare_parent(parent)
    except isolation.IsolationError as err:
        pytest.skip(str(err))
    stale, live = "/%s/measure-test-stale-%d" % (parent, os.getpid()), "/%s/measure-test-live-%d" % (parent, os.getpid())
    base = isolation._v1_dir("cpuacct") if isolation.cgroup_version() == 1 else isolation.CGROUP_ROOT
    isolation.create_cgroup(stale, isolation.online_cpus())
    isolation.create_cgroup(live, isolation.online_cpus())
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        isolation.attach(live, sleeper.pid)
        isolation.remove_stale_cgroups(parent, older_than_s=3600)
        assert os.path.isdir(base + stale), "a young cgroup was removed"
        isolation.remove_stale_cgroups(parent, older_than_s=0)
        assert not os.path.exists(base + stale)
        assert os.path.isdir(base + live), "a cgroup holding a process was removed"
    finally:
        sleeper.kill()
        sleeper.wait()
        isolation.remove_cgroup(stale)
        isolation.remove_cgroup(live)
    assert not os.path.exists(base + live)


class _CountingCandidate:
    """Stands in for a started sandbox: counts teardowns; its ``config`` read is where a
    termination lands (the statement right after start() returns)."""

    def __init__(self):
        self.stops = 0
        self.cgroups_path = None

    def start(self):
        pass

    @property
    def config(self):
        raise SystemExit(143)  # what campaign.exit_on_sigterm raises on SIGTERM

    def stop(self):
        self.stops += 1


def test_a_termination_right_after_the_sandbox_started_still_tears_it_down(monkeypatch, tmp_path):
    candidate = _CountingCandidate()
    monkeypatch.setattr(harness, "_make_candidate", lambda options, path, label: candidate)
    path = tmp_path / "c.py"
    path.write_text("pass\n")
    with pytest.raises(SystemExit):
        harness.measure_candidate(None, None, str(path), "c", harness.MeasureOptions())
    assert candidate.stops >= 1


def test_stopping_a_candidate_twice_tears_it_down_once(tmp_path, monkeypatch):
    from slurmbox.measure import candidate_sandbox
    path = tmp_path / "c.py"
    path.write_text("pass\n")
    candidate = candidate_sandbox.BareCandidate(str(path), "c")
    calls = []
    monkeypatch.setattr(candidate, "_stop", lambda: calls.append(1))
    candidate.stop()
    candidate.stop()
    assert calls == [1]
