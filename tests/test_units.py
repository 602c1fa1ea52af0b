"""Unit tests of option parsing, device mapping, site policy, bundles and framing."""

import os
import socket

import pytest

from slurmbox.sandbox import bundle, devices, options
from slurmbox.sandbox.framing import recv_frame, send_frame
from slurmbox.step.supervisor import decode_status



def test_parse_mounts_defaults_to_read_write_and_normalises():
    mounts = options.parse_mounts("/data:/in:ro,/scratch/x/:/out")
    assert mounts == [options.Mount("/data", "/in", True), options.Mount("/scratch/x", "/out", False)]


@pytest.mark.parametrize("text, needle", [
    ("/a", "not SRC:DST"), ("a:/b", "not absolute"), ("/a:/b:rx", "not ro or rw"),
    ("/a/../b:/c", "contains '..'"), ("/a:/", "replace the sandbox root"), ("/a:/b,", "empty mount entry"),
    ("/a:/run/slurmbox-cuda-checkpoint", "reserved for slurmbox"),
    ("/a:/run/slurmbox-broker/x/", "destination /run/slurmbox-broker of entry"),
])
def test_parse_mounts_rejects_malformed_entries(text, needle):
    with pytest.raises(options.OptionError) as err:
        options.parse_mounts(text)
    assert needle in str(err.value) and "--sandbox-mounts" in str(err.value)


def test_a_mount_next_to_the_reserved_destinations_is_fine():
    assert options.parse_mounts("/a:/run/slurmbox-cuda-checkpoints")[0].destination == "/run/slurmbox-cuda-checkpoints"


def test_command_line_wins_over_environment_and_null_means_no_value():
    merged = options.merge_sources({"network": "none", "sandbox": "(null)"},
                                   {"SLURMBOX_SANDBOX_NETWORK": "host", "SLURMBOX_SANDBOX_MOUNTS": "/a:/b"})
    assert merged == {"network": "none", "sandbox": "", "mounts": "/a:/b"}


def _policy(text):
    from slurmbox.settings.model import compile_policy
    return compile_policy(text)


SITE = """
cluster: test
profiles:
  default: {}
  strict: {network: none, allowed_networks: [none], allow_custom_image: false, allowed_mount_sources: [/data]}
partitions:
  secure: {sandbox: required, default_profile: strict}
  cpu: {sandbox: forbidden}
"""


def test_resolve_applies_profiles_and_partition_policy():
    policy = _policy(SITE)
    request = options.resolve({"sandbox": ""}, policy, "secure")
    assert request.profile == "strict" and request.network == "none"
    with pytest.raises(options.OptionError, match="requires sandboxing"):
        options.resolve({"sandbox": "", "no-sandbox": ""}, policy, "secure")
    with pytest.raises(options.OptionError, match="does not allow sandboxed steps"):
        options.resolve({"sandbox": ""}, policy, "cpu")
    with pytest.raises(options.OptionError, match="allows only none"):
        options.resolve({"sandbox": "strict", "network": "host"}, policy, "gpu")
    with pytest.raises(options.OptionError, match="does not allow custom images"):
        options.resolve({"sandbox": "strict", "image": "/"}, policy, "gpu")
    assert options.resolve({"sandbox": "yes", "network": "host"}, policy, "gpu").network == "host"


def test_gres_conf_files_and_index_lists():
    gres = "NodeName=n[1-2] Name=gpu Type=h100 File=/dev/nvidia[0-3]\nNodeName=n3 Name=gpu File=/dev/nvidia0\n"
    assert devices.gres_gpu_files(gres, "n2") == ["/dev/nvidia%d" % i for i in range(4)]
    assert devices.gres_gpu_files(gres, "n3") == ["/dev/nvidia0"]
    assert devices.parse_index_list("0-2,5") == [0, 1, 2, 5]


@pytest.fixture
def fake_dev(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")

    def make(name, major=195, minor=0):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
        return str(path)
    return make


def test_nvidia_plan_needs_nvproxy_and_adds_control_devices(fake_dev):
    gpu1 = fake_dev("nvidia1", minor=1)
    fake_dev("nvidiactl", minor=255)
    with pytest.raises(devices.DeviceError, match="--nvproxy"):
        devices.plan_devices([gpu1], set())
    plan = devices.plan_devices([gpu1], {"nvproxy"})
    assert [d.path for d in plan.devices] == ["/dev/nvidiactl", "/dev/nvidia1"]
    assert plan.runsc_flags == ["--nvproxy"] and plan.env == {"CUDA_VISIBLE_DEVICES": "0"}


def test_amd_and_trainium_need_the_documented_weaker_mode(fake_dev):
    render = fake_dev("dri/renderD128", major=226, minor=128)
    fake_dev("kfd", major=511, minor=0)
    with pytest.raises(devices.DeviceError, match="no amd device proxy"):
        devices.plan_devices([render], {"nvproxy"})
    plan = devices.plan_devices([render], set(), allow_unproxied=True)
    assert [d.path for d in plan.devices] == ["/dev/kfd", "/dev/dri/renderD128"]
    assert plan.env == {"ROCR_VISIBLE_DEVICES": "0"}
    neuron = fake_dev("neuron0", major=240)
    with pytest.raises(devices.DeviceError, match="no trainium device proxy"):
        devices.plan_devices([neuron], set())


def test_tpu_plan_uses_tpuproxy(fake_dev):
    accel = fake_dev("accel0", major=121)
    with pytest.raises(devices.DeviceError, match="--tpuproxy"):
        devices.plan_devices([accel], {"nvproxy"})
    assert devices.plan_devices([accel], {"tpuproxy"}).runsc_flags == ["--tpuproxy"]


def test_mixed_or_unknown_device_names_are_refused(fake_dev):
    with pytest.raises(devices.DeviceError, match="cannot tell the accelerator vendor"):
        devices.plan_devices([fake_dev("weird0")], {"nvproxy"})


def test_resolve_command_searches_path_inside_the_root(tmp_path):
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    tool = tmp_path / "usr" / "bin" / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "usr" / "bin" / "data").write_text("not executable")
    root = str(tmp_path)
    assert bundle.resolve_command("tool", "/nope:/usr/bin", root, "/") == "/usr/bin/tool"
    with pytest.raises(bundle.CommandNotFound):
        bundle.resolve_command("data", "/usr/bin", root, "/")
    with pytest.raises(bundle.CommandNotFound):
        bundle.resolve_command("sh", "/bin", root, "/")  # the host's /bin/sh is not in this root


def test_path_reachable_follows_every_directory_on_the_way():
    import pathlib
    import shutil
    import tempfile
    base = pathlib.Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path sits under a 0700 directory
    try:
        _check_reachability(base)
    finally:
        shutil.rmtree(base)


def _check_reachability(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    inner = locked / "open.txt"
    inner.write_text("x")
    inner.chmod(0o644)
    locked.chmod(0o700)
    os.chmod(tmp_path, 0o755)
    assert not bundle.path_reachable(str(inner), 12345, [12345])
    locked.chmod(0o711)
    assert bundle.path_reachable(str(inner), 12345, [12345])
    assert not bundle.path_reachable(str(inner), 12345, [12345], write=True)


def test_spec_masks_private_host_dirs_and_drops_internal_variables():
    request = options.SandboxRequest(profile="default")
    process = bundle.process_spec(["/bin/true"], {"A": "1", "SLURMBOX_SUPERVISOR_SOCKET": "/x"}, "/", 5, 5, [6],
                                  False, [])
    spec = bundle.build_spec(process, request, "n1", ["/home/u/job"], [])
    assert spec["process"]["env"] == ["A=1"]
    assert spec["process"]["user"] == {"uid": 5, "gid": 5, "additionalGids": [6]}
    destinations = [m["destination"] for m in spec["mounts"]]
    assert "/root" in destinations and "/home" in destinations
    assert destinations.index("/home") < destinations.index("/home/u/job")
    assert {"type": "network"} in spec["linux"]["namespaces"]
    host = bundle.build_spec(process, request, "n1", [], [], network="host")
    assert {"type": "network"} not in host["linux"]["namespaces"]


@pytest.mark.parametrize("code, expected", [(0, {"exit": 0}), (7, {"exit": 7}), (127, {"exit": 127}),
                                            (143, {"signal": 15}), (-9, {"signal": 9})])
def test_decode_status(code, expected):
    assert decode_status(code) == expected


def test_frames_carry_json_and_descriptors():
    left, right = socket.socketpair()
    read_end, write_end = os.pipe()
    send_frame(left, {"argv": ["x"] * 1000}, fds=[write_end])
    message, fds = recv_frame(right)
    assert message == {"argv": ["x"] * 1000} and len(fds) == 1
    os.write(fds[0], b"ok")
    assert os.read(read_end, 2) == b"ok"
    left.close()
    assert recv_frame(right) == (None, [])


def test_platform_auto_prefers_systrap_and_named_platforms_must_exist():
    from slurmbox.sandbox.runsc import RunscError, choose_platform
    assert choose_platform("auto", {"platforms": ["kvm", "ptrace"]}) == "ptrace"
    assert choose_platform("auto", {"platforms": ["kvm", "ptrace", "systrap"]}) == "systrap"
    with pytest.raises(RunscError, match="systrap"):
        choose_platform("systrap", {"platforms": ["kvm", "ptrace"], "version": "0.0~20221219.0"})


def test_device_index_lists_are_bounded():
    with pytest.raises(ValueError, match="out of bounds"):
        devices.parse_index_list("0-999999999")


def test_resolve_looks_at_no_file_and_leaves_sources_as_given(tmp_path):
    """Root's view of a user's path must never answer the user: resolve checks syntax and
    policy only; source_problem judges what the supervisor opened as the user."""
    policy = _policy(SITE)
    request = options.resolve({"sandbox": "", "mounts": "%s/missing/link:/d:ro" % tmp_path}, policy, "gpu")
    assert request.mounts == [options.Mount("%s/missing/link" % tmp_path, "/d", True)]


def test_source_problem_refuses_system_trees_the_runtime_and_sources_outside_the_profile(tmp_path):
    policy = _policy(SITE.replace("[/data]", "[%s]" % (tmp_path / "data")))
    strict, default = policy.profiles["strict"], policy.profiles[policy.partition("gpu").default_profile]
    assert options.source_problem(str(tmp_path / "data" / "x"), strict) is None
    assert "outside the profile's allowed mount sources" in options.source_problem(str(tmp_path / "other"), strict)
    for system in ("/", "/dev", "/proc", "/proc/1", "/sys/fs/cgroup"):
        assert "system directory" in options.source_problem(system, default), system
    runtime = tmp_path / "run"
    (runtime / "n1").mkdir(parents=True)
    assert "runtime directory" in options.source_problem(str(runtime / "n1"), default, str(runtime))
    assert options.source_problem("/procfs-lookalike", default) is None


def test_broker_keeps_loader_variables_and_foreign_job_ids_away_from_srun():
    from slurmbox.step.step_broker import StepBroker
    broker = StepBroker("/nonexistent", 1000, 1000, [], (0, 1, 2), "/", "/etc/slurm/slurm.conf", "42")
    env = broker._environment({"LD_PRELOAD": "/x.so", "LD_LIBRARY_PATH": "/x", "GCONV_PATH": "/x",
                               "SLURM_JOB_ID": "7", "SLURM_CONF": "/evil", "SLURMBOX_SANDBOX": "0",
                               "OMP_NUM_THREADS": "4"})
    assert env == {"OMP_NUM_THREADS": "4", "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_JOB_ID": "42",
                   "SLURM_JOBID": "42"}


@pytest.mark.parametrize("result, expected", [({"signal": 9}, -9), ({"signal": 15}, -15),
                                              ({"signal": 19}, 128 + 19), ({"exit": 3}, 3)])
def test_launcher_leaves_as_the_sandboxed_process_left(result, expected):
    import subprocess
    import sys
    code = "from slurmbox.step.launcher import _exit_like; _exit_like(%r)" % (result,)
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == expected


# -- the step broker's srun allowlist (slurmbox.sandbox.srun_allowlist) ----------------------------------------

from slurmbox.sandbox import srun_allowlist  # noqa: E402


@pytest.mark.parametrize("args", [
    ["--prolog=/bin/sh", "true"], ["--prolog", "/bin/sh", "true"], ["--epilog=x", "true"],
    ["--task-prolog=x", "true"], ["--task-epilog", "x", "true"], ["--jobid=7", "--overlap", "true"],
    ["--jobi=7", "true"], ["--job=7", "true"], ["--container=/b", "true"], ["--bcast=/tmp/x", "true"],
    ["-M", "other", "true"], ["--clusters=other", "true"], ["-p", "ondemand", "true"], ["--uid=0", "true"],
    ["-lZ", "true"], ["--het-group=1", "true"], ["--pro=/bin/sh", "true"], ["--sandbox-mount=/a:/b", "true"],
])
def test_broker_refuses_options_outside_the_allowlist_naming_them(args):
    with pytest.raises(srun_allowlist.RefusedOption, match="srun option"):
        srun_allowlist.parse_srun_args(args, partition_requires_sandbox=False)


def test_broker_rebuilds_srun_from_allowed_options_with_the_command_after_a_double_dash():
    checked = srun_allowlist.parse_srun_args(["-n4", "-N", "2", "-lu", "--overlap", "--export=ALL,A=b", "-K",
                                              "app", "--prolog=/bin/sh"], False)
    assert checked.argv("/usr/bin/srun") == ["/usr/bin/srun", "--ntasks=4", "--nodes=2", "--label", "--unbuffered",
                                            "--overlap", "--export=ALL,A=b", "--kill-on-bad-exit", "--", "app",
                                            "--prolog=/bin/sh"]
    assert srun_allowlist.parse_srun_args(["--", "-x"], False).command == ("-x",)


def test_broker_refuses_no_sandbox_only_where_the_partition_requires_it():
    with pytest.raises(srun_allowlist.RefusedOption, match="requires sandboxing"):
        srun_allowlist.parse_srun_args(["--no-sandbox", "true"], True)
    assert srun_allowlist.parse_srun_args(["--no-sandbox", "true"], False).options == (("no-sandbox", None),)
    for bad in (["--overlap=1", "true"], ["-n"], ["--ntasks"], []):
        with pytest.raises(srun_allowlist.RefusedOption):
            srun_allowlist.parse_srun_args(bad, False)


def test_broker_environment_drops_srun_inputs_that_stand_for_refused_options():
    env = srun_allowlist.host_srun_environment({
        "SLURM_TASK_PROLOG": "/x", "SLURM_PROLOG": "/x", "SLURM_CONTAINER": "/b", "SLURM_CLUSTERS": "c",
        "SLURM_SPANK_slurmbox_no_sandbox": "1", "_SLURM_SPANK_OPTION_slurmbox_no-sandbox": "", "SLURM_JOB_ID": "9",
        "SLURM_NTASKS": "4", "HOME": "/home/u", "SLURM_SPANK__SLURM_SPANK_OPTION_slurmbox_sandbox": "(null)",
        "SLURM_SPANK__SLURM_SPANK_OPTION_other_x": "1"})
    assert env == {"SLURM_NTASKS": "4", "HOME": "/home/u", "SLURM_SPANK__SLURM_SPANK_OPTION_slurmbox_sandbox": "(null)"}


def test_bind_destinations_must_exist_in_the_root_as_the_same_kind_without_symlinks(tmp_path):
    root = tmp_path / "image"
    (root / "mnt").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "hosts").write_text("")
    (root / "lib").symlink_to("usr/lib")
    assert bundle.mount_point_problem(str(root), "/mnt", True) is None
    assert bundle.mount_point_problem(str(root), "/etc/hosts", False) is None
    assert "does not exist" in bundle.mount_point_problem(str(root), "/etc/probe", False)
    assert "/x does not exist" in bundle.mount_point_problem(str(root), "/x/sub/deeper", True)
    assert "symbolic link" in bundle.mount_point_problem(str(root), "/lib/x", True)
    assert "the source is a directory" in bundle.mount_point_problem(str(root), "/etc/hosts", True)
    assert "the source is not a directory" in bundle.mount_point_problem(str(root), "/mnt", False)
    assert bundle.mount_point_problem("/", "/etc/slurmbox-never-created-%d" % os.getpid(), False) is not None


def test_the_installed_launcher_is_one_file_that_needs_nothing_of_slurmbox(tmp_path):
    """It runs with ``python -IS`` (no site packages): framing.py is inlined at install."""
    import subprocess
    import sys

    from slurmbox.spank_plugin.install import install_launcher
    path = install_launcher(str(tmp_path / "slurmbox-launch"), python=sys.executable)
    with open(path) as handle:
        text = handle.read()
    assert "import slurmbox" not in text and "from slurmbox" not in text
    result = subprocess.run([path, "true"], capture_output=True, text=True, env={}, cwd=str(tmp_path))
    assert result.returncode == 125
    assert "outside a sandboxed Slurm step" in result.stderr


def test_the_runsc_door_gives_runsc_pipes_and_builds_each_verb(tmp_path):
    """runsc re-owns the stdio it is given: every call through sandbox.runsc gets pipes."""
    from slurmbox.sandbox import runsc
    fake = tmp_path / "runsc"
    log = tmp_path / "calls"
    fake.write_text("#!/bin/sh\n"
                    "if [ -p /dev/stdin ]; then kind=pipe; else kind=other; fi\n"
                    "echo \"$kind $*\" >> %s\n"
                    "case \"$*\" in *state*) echo '{\"status\": \"running\", \"pid\": 7}';; esac\n" % log)
    fake.chmod(0o755)
    prefix = [str(fake), "--root", "/r"]
    runsc.kill(prefix, "c1", 9, pid=4)
    runsc.kill(prefix, "c1", "KILL", all_processes=True)
    runsc.delete(prefix, "c1")
    assert runsc.state(prefix, "c1") == {"status": "running", "pid": 7}
    proc = runsc.spawn(prefix + ["run", "--bundle", "/b", "c1"])
    proc.communicate()
    assert runsc.help_text(str(fake), "--version") == ""
    assert log.read_text().splitlines() == [
        "pipe --root /r kill --pid 4 c1 9", "pipe --root /r kill --all c1 KILL", "pipe --root /r delete --force c1",
        "pipe --root /r state c1", "pipe --root /r run --bundle /b c1", "pipe --version"]
