"""slurmbox doctor: each hardware library missing, present-but-failing and
present (fakes shaped like pynvml, amdsmi and pyverbs, fed with recorded real
outputs), the other checks, and the --json schema on this machine."""

import json
import os
import subprocess
import sys
import types

import pytest

from slurmbox.doctor import hardware
from slurmbox.doctor.context import GresLine, NodeContext, parse_gres_conf
from slurmbox.doctor.device_checks import check_clocks, check_gres, check_rdma, check_vendor
from slurmbox.doctor.node_checks import cgroup_layout, check_checkpoint_store, check_resources, check_site
from slurmbox.doctor.report import FAIL, JSON_SCHEMA, NOT_PRESENT, PASS, WARN, Check, report
from slurmbox.doctor.run import run_checks
from slurmbox.doctor.runtime_checks import check_device_proxy, release_date
from slurmbox.settings.model import load_site_file

SAMPLES = "/work/shared/samples"
EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "site-configs")
HGX = load_site_file(os.path.join(EXAMPLES_DIR, "hgx-h100-h200-spot.yaml"))
MI300X = load_site_file(os.path.join(EXAMPLES_DIR, "mi300x-rocm.yaml"))

# -- fakes shaped like the real libraries --------------------------------------------

# A DGX H100 as NVML reports it (names, PCI bus ids and driver of a real system).
H100_BUS_IDS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
                "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"]


class FakeNVMLError(Exception):
    """Like pynvml.NVMLError: ``value`` is the nvmlReturn_t, str() its nvmlErrorString."""

    STRINGS = {4: "Insufficient Permissions", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found",
               999: "Unknown Error"}

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return self.STRINGS[self.value]


def fake_pynvml(count=8, init_error=None, query_error=None, restricted=1, minors=None, as_bytes=False):
    """A pynvml stand-in with the real function names, constants and return shapes."""
    minors = list(range(count)) if minors is None else minors
    text = (lambda s: s.encode()) if as_bytes else (lambda s: s)
    module = types.SimpleNamespace(NVMLError=FakeNVMLError, NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS=0,
                                   NVML_FEATURE_DISABLED=0, NVML_FEATURE_ENABLED=1, shutdowns=[])

    def init():
        if init_error:
            raise FakeNVMLError(init_error)

    def count_devices():
        if query_error:
            raise FakeNVMLError(query_error)
        return count

    module.nvmlInit = init
    module.nvmlShutdown = lambda: module.shutdowns.append(True)
    module.nvmlSystemGetDriverVersion = lambda: text("550.54.15")
    module.nvmlDeviceGetCount = count_devices
    module.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    module.nvmlDeviceGetName = lambda h: text("NVIDIA H100 80GB HBM3")
    module.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=text(H100_BUS_IDS[h[1]]))
    module.nvmlDeviceGetMinorNumber = lambda h: minors[h[1]]
    module.nvmlDeviceGetUUID = lambda h: text("GPU-%08d-0000-0000-0000-000000000000" % h[1])
    module.nvmlDeviceGetAPIRestriction = lambda h, api: restricted
    return module


# BDFs of a real 8x MI300X platform (shared/samples/amd-topo/mi300x-8gpu-amd-smi-topology-tables.txt).
MI300X_BDFS = ["0000:0c:00.0", "0000:22:00.0", "0000:38:00.0", "0000:5c:00.0", "0000:9f:00.0", "0000:af:00.0",
               "0000:bf:00.0", "0000:df:00.0"]


class FakeAmdSmiException(Exception):
    """Like amdsmi.AmdSmiException."""


class FakeAmdSmiLibraryException(FakeAmdSmiException):
    """Like amdsmi.AmdSmiLibraryException: ``err_code`` and ``err_info``."""

    def __init__(self, err_code, err_info):
        super().__init__("An error occurred with code: %d(%s)" % (err_code, err_info))
        self.err_code, self.err_info = err_code, err_info


def fake_amdsmi(count=8, init_error=None):
    module = types.SimpleNamespace(AmdSmiException=FakeAmdSmiException,
                                   AmdSmiLibraryException=FakeAmdSmiLibraryException,
                                   AmdSmiInitFlags=types.SimpleNamespace(INIT_AMD_GPUS=2), init_flags=[])

    def init(flags=None):
        module.init_flags.append(flags)
        if init_error:
            raise FakeAmdSmiLibraryException(*init_error)

    module.amdsmi_init = init
    module.amdsmi_shut_down = lambda: None
    module.amdsmi_get_processor_handles = lambda: [("amd", i) for i in range(count)]
    module.amdsmi_get_gpu_asic_info = lambda h: {"market_name": "AMD Instinct MI300X", "vendor_id": 0x1002,
                                                 "device_id": 0x74a1, "rev_id": 0, "asic_serial": "0x0"}
    module.amdsmi_get_gpu_device_bdf = lambda h: MI300X_BDFS[h[1]]
    module.amdsmi_get_gpu_driver_info = lambda h: {"driver_name": "amdgpu", "driver_version": "6.8.5",
                                                   "driver_date": "2015/01/01 00:00"}
    return module


class FakePyverbsRDMAError(Exception):
    """Like pyverbs.pyverbs_error.PyverbsRDMAError."""


VERBS_ENUMS = types.SimpleNamespace(IBV_PORT_NOP=0, IBV_PORT_DOWN=1, IBV_PORT_INIT=2, IBV_PORT_ARMED=3,
                                    IBV_PORT_ACTIVE=4, IBV_PORT_ACTIVE_DEFER=5, IBV_LINK_LAYER_UNSPECIFIED=0,
                                    IBV_LINK_LAYER_INFINIBAND=1, IBV_LINK_LAYER_ETHERNET=2)
_IBSTAT_STATE = {"Down": 1, "Initializing": 2, "Armed": 3, "Active": 4}
_IBSTAT_LAYER = {"InfiniBand": 1, "Ethernet": 2}


def ibstat_devices(text):
    """{CA name: [(state, link layer)] per port} from recorded `ibstat` output."""
    devices, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("CA '"):
            current = line[4:-1]
            devices[current] = []
        elif line.startswith("Port ") and line.endswith(":") and current:
            devices[current].append({})
        elif ":" in line and current and devices[current]:
            key, value = (part.strip() for part in line.split(":", 1))
            devices[current][-1][key] = value
    return {name: [(_IBSTAT_STATE[p["State"]], _IBSTAT_LAYER[p["Link layer"]]) for p in ports]
            for name, ports in devices.items()}


def fake_pyverbs(devices=None, list_error=None):
    """A pyverbs stand-in: device.get_device_list / device.Context / enums, from ibstat data."""
    class Context:
        def __init__(self, name):
            self.ports = devices[name]

        def query_device(self):
            return types.SimpleNamespace(phys_port_cnt=len(self.ports))

        def query_port(self, number):
            state, layer = self.ports[number - 1]
            return types.SimpleNamespace(state=state, link_layer=layer)

        def close(self):
            pass

    def get_device_list():
        if list_error:
            raise FakePyverbsRDMAError(list_error)
        return [types.SimpleNamespace(name=name.encode()) for name in devices]

    return types.SimpleNamespace(device=types.SimpleNamespace(get_device_list=get_device_list, Context=Context),
                                 enums=VERBS_ENUMS,
                                 pyverbs_error=types.SimpleNamespace(PyverbsRDMAError=FakePyverbsRDMAError))


def _ctx(vendors=(), site=None, node="hgx-h100-001", gres=None, nvidia=None, amd=None, rdma=None, euid=0):
    ctx = NodeContext(node=node, slurm_conf="/nonexistent/slurm.conf", site=site, gres=gres,
                      gres_conf="/nonexistent/gres.conf", vendors=set(vendors), euid=euid)
    ctx.nvidia = nvidia if nvidia is not None else hardware.probe_nvidia(None)
    ctx.amd = amd if amd is not None else hardware.probe_amd(None)
    ctx.rdma = rdma if rdma is not None else hardware.probe_rdma(None)
    return ctx


def _nvidia_gres(count=8):
    return [GresLine("gpu", "h100", ["/dev/nvidia%d" % i for i in range(count)])]


# -- NVML ----------------------------------------------------------------------------

@pytest.mark.parametrize("configured, status", [(True, FAIL), (False, NOT_PRESENT)])
def test_nvml_library_missing(configured, status):
    ctx = _ctx(["nvidia"] if configured else [], nvidia=hardware.probe_nvidia(None))
    check = check_vendor(ctx, "nvidia", "devices.nvml", ctx.nvidia)
    assert check.status == status
    assert "nvidia-ml-py" in check.summary
    if configured:
        assert "pip install nvidia-ml-py" in check.action


@pytest.mark.parametrize("configured, status", [(True, FAIL), (False, NOT_PRESENT)])
def test_nvml_present_but_failing(configured, status):
    probe = hardware.probe_nvidia(fake_pynvml(init_error=9))
    assert (probe.state, probe.error_code) == (hardware.FAILED, 9)
    check = check_vendor(_ctx(["nvidia"] if configured else []), "nvidia", "devices.nvml", probe)
    assert check.status == status and "Driver Not Loaded" in check.summary
    if configured:
        assert "load the NVIDIA driver" in check.action


def test_nvml_query_failure_after_init_still_shuts_down():
    module = fake_pynvml(query_error=999)
    probe = hardware.probe_nvidia(module)
    assert probe.state == hardware.FAILED and "Unknown Error" in probe.detail
    assert module.shutdowns == [True]


def test_real_nvidia_ml_py_on_this_machine_reports_its_missing_driver_cleanly():
    pynvml = hardware.import_nvml()
    if pynvml is None:
        pytest.skip("nvidia-ml-py is not installed in this environment")
    probe = hardware.probe_nvidia(pynvml)
    if probe.state == hardware.OK:
        pytest.skip("this machine has an NVIDIA driver")
    assert probe.state == hardware.FAILED and probe.error_code in (9, 12)  # driver not loaded / no libnvidia-ml
    assert check_vendor(_ctx(), "nvidia", "devices.nvml", probe).status == NOT_PRESENT


@pytest.mark.parametrize("as_bytes", [False, True])
def test_nvml_present_and_matching_gres_passes(as_bytes):
    probe = hardware.probe_nvidia(fake_pynvml(as_bytes=as_bytes))
    assert [d.bus_id for d in probe.devices] == H100_BUS_IDS and probe.clocks_restricted is True
    check = check_vendor(_ctx(["nvidia"], site=HGX, gres=_nvidia_gres()), "nvidia", "devices.nvml", probe)
    assert check.status == PASS
    assert check.summary == "8 x NVIDIA H100 80GB HBM3, driver 550.54.15"


def test_nvml_disagreeing_with_gres_fails():
    probe = hardware.probe_nvidia(fake_pynvml(count=4, minors=[0, 1, 2, 3]))
    check = check_vendor(_ctx(["nvidia"], gres=_nvidia_gres(8)), "nvidia", "devices.nvml", probe)
    assert check.status == FAIL and "gres.conf lists 8 device files" in check.summary
    swapped = hardware.probe_nvidia(fake_pynvml(count=2, minors=[0, 5]))
    check = check_vendor(_ctx(["nvidia"], gres=_nvidia_gres(2)), "nvidia", "devices.nvml", swapped)
    assert check.status == FAIL and "minors [0, 1] but NVML reports [0, 5]" in check.summary


def test_gpus_present_but_not_configured_warn():
    probe = hardware.probe_nvidia(fake_pynvml())
    assert check_vendor(_ctx(), "nvidia", "devices.nvml", probe).status == WARN


# -- AMD SMI -------------------------------------------------------------------------

@pytest.mark.parametrize("probe, configured, status, needle", [
    (lambda: hardware.probe_amd(None), True, FAIL, "amdsmi"),
    (lambda: hardware.probe_amd(None), False, NOT_PRESENT, "amdsmi"),
    (lambda: hardware.probe_amd(fake_amdsmi(init_error=(8, "AMDSMI_STATUS_INIT_ERROR"))), True, FAIL,
     "AMDSMI_STATUS_INIT_ERROR"),
    (lambda: hardware.probe_amd(fake_amdsmi(init_error=(8, "AMDSMI_STATUS_INIT_ERROR"))), False, NOT_PRESENT,
     "amdsmi_init failed"),
    (lambda: hardware.probe_amd(fake_amdsmi()), True, PASS, "8 x AMD Instinct MI300X, driver 6.8.5"),
    (lambda: hardware.probe_amd(fake_amdsmi(count=0)), True, FAIL, "sees none"),
])
def test_amd_smi_missing_failing_and_present(probe, configured, status, needle):
    ctx = _ctx(["amd"] if configured else [], site=MI300X, node="mi300x-01",
               gres=[GresLine("gpu", "mi300x", ["/dev/dri/renderD%d" % (128 + i) for i in range(8)])])
    check = check_vendor(ctx, "amd", "devices.amdsmi", probe())
    assert check.status == status and needle in check.summary, check


def test_amd_probe_asks_for_gpus_and_reports_bdfs():
    module = fake_amdsmi()
    probe = hardware.probe_amd(module)
    assert module.init_flags == [2] and [d.bus_id for d in probe.devices] == MI300X_BDFS


# -- RDMA (pyverbs) ------------------------------------------------------------------

def test_rdma_library_missing_is_not_present():
    check = check_rdma(_ctx(rdma=hardware.probe_rdma(None)))
    assert check.status == NOT_PRESENT and "python3-pyverbs" in check.summary + check.action


def test_rdma_without_devices_is_not_present_with_the_real_pyverbs_error():
    # What the real pyverbs raises on a machine with no RDMA devices (seen on this machine).
    check = check_rdma(_ctx(rdma=hardware.probe_rdma(fake_pyverbs(list_error="Failed to get devices list"))))
    assert check.status == NOT_PRESENT and "Failed to get devices list" in check.summary


def test_real_pyverbs_here_answers_not_present():
    verbs = hardware.import_pyverbs()
    if verbs is None:
        pytest.skip("pyverbs (python3-pyverbs) is not installed here")
    probe = hardware.probe_rdma(verbs)
    if probe.ports:
        pytest.skip("this machine has RDMA ports")
    assert check_rdma(_ctx(rdma=probe)).status == NOT_PRESENT


def test_rdma_ports_from_a_recorded_ibstat_pass_and_name_link_layers():
    text = open(os.path.join(SAMPLES, "ibstat", "ibstat-8hca-cx5-mixed-ib-multi-subnet-plus-ethernet.txt")).read()
    devices = ibstat_devices(text)
    probe = hardware.probe_rdma(fake_pyverbs(devices))
    assert probe.state == hardware.OK and len(probe.ports) == sum(len(p) for p in devices.values())
    check = check_rdma(_ctx(rdma=probe))
    assert "mlx4_0/1 ACTIVE Ethernet" in check.summary and "mlx5_0/1 ACTIVE InfiniBand" in check.summary
    down = [p for p in probe.ports if p.state != "ACTIVE"]
    assert check.status == (WARN if down else PASS)


def test_rdma_port_initializing_without_subnet_manager_fails():
    text = open(os.path.join(SAMPLES, "ibstat", "ibstat-cx3-port-initializing-no-sm.txt")).read()
    probe = hardware.probe_rdma(fake_pyverbs(ibstat_devices(text)))
    check = check_rdma(_ctx(rdma=probe))
    assert check.status == FAIL and "mlx4_0/1 INIT InfiniBand" in check.summary
    assert "subnet manager" in check.action


def test_rdma_some_ports_down_warn():
    probe = hardware.probe_rdma(fake_pyverbs({"mlx5_0": [(4, 1)], "mlx5_1": [(1, 1)]}))
    check = check_rdma(_ctx(rdma=probe))
    assert check.status == WARN and "1 of 2" in check.summary


# -- GPU clocks ------------------------------------------------------------------------

def test_gpu_clock_permission():
    gpus = hardware.probe_nvidia(fake_pynvml())
    assert check_clocks(_ctx(nvidia=gpus, euid=0)).status == PASS
    assert check_clocks(_ctx(nvidia=gpus, euid=1000, site=HGX)).status == FAIL  # HGX example locks clocks
    assert check_clocks(_ctx(nvidia=gpus, euid=1000, site=MI300X)).status == WARN
    free = hardware.probe_nvidia(fake_pynvml(restricted=0))
    assert check_clocks(_ctx(nvidia=free, euid=1000, site=HGX)).status == PASS
    assert check_clocks(_ctx()).status == NOT_PRESENT


# -- runtime: device proxy ---------------------------------------------------------------

@pytest.mark.parametrize("vendors, flags, status, needle", [
    ([], [], NOT_PRESENT, "no accelerators"),
    (["nvidia"], ["platform"], FAIL, "need runsc --nvproxy"),
    (["tpu"], ["tpuproxy"], PASS, "runsc --tpuproxy available"),
    (["tpu"], [], FAIL, "--tpuproxy"),
    (["amd"], [], WARN, "gVisor has no proxy"),
    (["trainium"], [], WARN, "allow_unproxied_devices"),
])
def test_device_proxy_check(vendors, flags, status, needle):
    check = check_device_proxy(_ctx(vendors), "/bin/false", {"version": "test", "flags": flags})
    assert check.status == status and needle in check.summary + check.action


def test_nvproxy_driver_must_be_in_runscs_supported_list(tmp_path):
    runsc = tmp_path / "runsc"
    runsc.write_text("#!/bin/sh\n[ \"$1 $2\" = 'nvproxy list-supported-drivers' ] && printf '535.104.05\\n"
                     "550.54.14\\n'\n")
    runsc.chmod(0o755)
    gpus = hardware.probe_nvidia(fake_pynvml())  # driver 550.54.15: not listed
    check = check_device_proxy(_ctx(["nvidia"], nvidia=gpus), str(runsc), {"version": "t", "flags": ["nvproxy"]})
    assert check.status == FAIL and "550.54.15 is not among" in check.summary
    runsc.write_text(runsc.read_text().replace("550.54.14", "550.54.15"))
    check = check_device_proxy(_ctx(["nvidia"], nvidia=gpus), str(runsc), {"version": "t", "flags": ["nvproxy"]})
    assert check.status == PASS


def test_runsc_release_dates():
    assert release_date("0.0~20221219.0") == 20221219
    assert release_date("release-20240708.0") == 20240708
    assert release_date("unknown") is None


# -- node checks -----------------------------------------------------------------------

def test_cgroup_layouts():
    v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
    hybrid = ("tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
              "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    v1 = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
    assert [cgroup_layout(t) for t in (v2, hybrid, v1, "")] == ["v2", "hybrid", "v1", "none"]


def test_checkpoint_store_space(tmp_path):
    site = HGX.model_copy(deep=True)
    site.checkpoint_store.path = str(tmp_path)
    site.checkpoint_store.min_free_mb = 1
    assert check_checkpoint_store(_ctx(site=site)).status in (PASS, WARN)
    site.checkpoint_store.min_free_mb = 10 ** 12
    check = check_checkpoint_store(_ctx(site=site))
    assert check.status == FAIL and "floor 1000000000000 MB" in check.summary
    site.checkpoint_store.path = str(tmp_path / "absent")
    assert check_checkpoint_store(_ctx(site=site)).status == FAIL  # partitions checkpoint: the store must exist


def test_gres_conf_with_bytes_that_are_not_utf8_is_read_like_slurm_reads_it(tmp_path):
    from slurmbox.doctor.context import gather
    gres = tmp_path / "gres.conf"
    gres.write_bytes(b"# r\xe9sum\xe9 (Latin-1)\nNodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[0-1]\n")
    ctx = gather(node="n1", slurm_conf=str(tmp_path / "slurm.conf"), site_config="", gres_conf=str(gres),
                 probes={"nvidia": None, "amd": None, "rdma": None})
    assert [line.files for line in ctx.gres] == [["/dev/nvidia0", "/dev/nvidia1"]]


def test_plugstack_settings_read_files_with_bytes_that_are_not_utf8(tmp_path):
    from slurmbox.settings.plugstack import slurmbox_settings
    (tmp_path / "slurm.conf").write_bytes(b"# caf\xe9\nClusterName=x\n")
    (tmp_path / "plugstack.conf").write_bytes(b"# \xff\nrequired /opt/slurmbox/slurmbox_spank.so runtime_dir=/run/x\n")
    settings = slurmbox_settings(str(tmp_path / "slurm.conf"))
    assert settings["runtime_dir"] == "/run/x" and settings["plugstack"] == str(tmp_path / "plugstack.conf")
    if os.geteuid() == 0:  # root lists the runtime directory plugstack.conf names (none here)
        result = subprocess.run([sys.executable, "-m", "slurmbox.cli.main", "sandbox", "ls", "--slurm-conf",
                                 str(tmp_path / "slurm.conf"), "--json"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and json.loads(result.stdout) == [], result.stderr


def test_gres_device_files(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("creating device nodes needs root")
    os.mknod(str(tmp_path / "nvidia0"), 0o600 | 0o020000, os.makedev(195, 0))
    (tmp_path / "nvidia1").write_text("not a device")
    text = "NodeName=n[1-2] Name=gpu Type=h100 File=%s/nvidia[0-1]\nNodeName=n3 Name=gpu File=/dev/x\n" % tmp_path
    lines = parse_gres_conf(text, "n2")
    assert [l.files for l in lines] == [[str(tmp_path / "nvidia0"), str(tmp_path / "nvidia1")]]
    check = check_gres(_ctx(gres=lines))
    assert check.status == FAIL and str(tmp_path / "nvidia1") in check.summary
    assert check_gres(_ctx(gres=parse_gres_conf(text.replace("[0-1]", "0"), "n1"))).status == PASS
    assert check_gres(_ctx(gres=None)).status == NOT_PRESENT
    assert check_gres(_ctx(gres=parse_gres_conf(text, "other"))).status == NOT_PRESENT


# `slurmd -C` as printed on this project's machine (2 cores, ~24 GB).
SLURMD_C = "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105\n" \
    "UpTime=0-01:52:24\n"


def test_node_resources_against_slurmd_detection():
    small = HGX.model_copy(deep=True)
    small.node_groups["h100"].cpus, small.node_groups["h100"].real_memory_mb = 2, 20000
    check = check_resources(_ctx(site=small), SLURMD_C)
    assert check.status == PASS and "CPUs=2 RealMemory=24105" in check.summary
    check = check_resources(_ctx(site=HGX), SLURMD_C)  # the example's 224 CPUs / 2 TB on this small machine
    assert check.status == FAIL and "cpus: 224 but slurmd detects 2" in check.summary
    assert "real_memory_mb: 2000000" in check.summary
    assert check_resources(_ctx(site=HGX, node="elsewhere"), SLURMD_C).status == NOT_PRESENT
    assert check_resources(_ctx(site=small), "garbage").status == WARN


def test_site_check_names_the_node_group():
    assert check_site(_ctx(site=HGX)).summary.endswith("node group h100)")
    assert check_site(_ctx(site=HGX, node="elsewhere")).status == WARN
    ctx = _ctx()
    ctx.site_problem, ctx.site_source = "site.yaml:3: cluster: required key is missing", "site.yaml"
    assert check_site(ctx).status == FAIL

    ctx = _ctx(site=HGX)
    ctx.plugstack_required = ["spot"]
    assert check_site(ctx).status == PASS
    ctx.plugstack_required = ["secure"]
    check = check_site(ctx)
    assert check.status == FAIL and "required_partitions=secure" in check.summary and "spot" in check.summary


def test_a_crashing_check_group_becomes_a_failure_not_a_traceback(monkeypatch):
    from slurmbox.doctor import run

    def boom(ctx):
        raise KeyError("bug")
    monkeypatch.setattr(run, "check_runtime", boom)
    checks = run_checks(_ctx())
    crashed = [c for c in checks if c.id == "runtime.internal"]
    assert crashed and crashed[0].status == FAIL and "KeyError" in crashed[0].summary
    assert any(c.id == "node.munge" for c in checks)  # the other groups still ran


# -- the command, on this machine ----------------------------------------------------------

def _doctor(*args):
    return subprocess.run([sys.executable, "-m", "slurmbox.cli.main", "doctor", *args], capture_output=True,
                          text=True, timeout=300)


def test_report_validates_against_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(JSON_SCHEMA)
    good = report("n1", [Check("runsc.present", "runtime", PASS, "ok")])
    jsonschema.validate(good, JSON_SCHEMA)
    bad = dict(good, checks=[dict(good["checks"][0], status="maybe")])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, JSON_SCHEMA)
    with pytest.raises(ValueError):
        Check("x.y", "node", "maybe", "s")


def test_doctor_json_on_this_machine_matches_the_schema_and_hardware_is_not_present(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    result = _doctor("--json", "--slurm-conf", str(tmp_path / "slurm.conf"))
    assert "Traceback" not in result.stderr
    data = json.loads(result.stdout)
    jsonschema.validate(data, JSON_SCHEMA)
    statuses = {c["id"]: c["status"] for c in data["checks"]}
    hardware_checks = ["devices.gres", "devices.nvml", "devices.amdsmi", "devices.rdma", "devices.gpu-clocks",
                       "runsc.device-proxy"]
    has_gpu = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")
    if not has_gpu and not os.path.isdir("/sys/class/infiniband"):
        assert {statuses[c] for c in hardware_checks} == {NOT_PRESENT}, statuses
    assert statuses["node.slurmd"] == FAIL  # no slurm.conf there
    assert result.returncode == (0 if data["ok"] else 1) == 1
    assert "check(s) failed" in result.stderr
    for check in data["checks"]:
        assert check["action"] and check["summary"]


def test_doctor_text_output_gives_an_action_for_every_warning_and_failure(tmp_path):
    result = _doctor("--slurm-conf", str(tmp_path / "slurm.conf"),
                     "--site-config", os.path.join(EXAMPLES_DIR, "mixed-h200-mi300x-cpu.yaml"), "--node", "cpu-001")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(("WARN", "FAIL")):
            assert lines[index + 1].strip().startswith("->"), line
    assert any(l.startswith("PASS  node.site-config") and "node group cpu" in l for l in lines)


def test_doctor_schema_option_prints_the_schema():
    result = _doctor("--schema")
    assert result.returncode == 0 and json.loads(result.stdout) == json.loads(json.dumps(JSON_SCHEMA))


def test_doctor_never_hands_its_own_stdin_to_runsc(tmp_path):
    # runsc re-owns the stdio it is given to the sandbox user; the trivial-sandbox check
    # must give it pipes, or a doctor run from a shell would turn /dev/null into nobody's file.
    stdin_file = tmp_path / "stdin"
    stdin_file.write_text("")
    os.chown(stdin_file, 0, 0)
    with open(stdin_file) as stdin:
        result = subprocess.run([sys.executable, "-m", "slurmbox.cli.main", "doctor", "--json", "--slurm-conf",
                                 str(tmp_path / "slurm.conf")], stdin=stdin, capture_output=True, text=True,
                                timeout=300)
    checks = {c["id"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    if os.geteuid() == 0:
        assert checks.get("runsc.sandbox-start") == PASS, checks
    assert (os.stat(stdin_file).st_uid, os.stat(stdin_file).st_gid) == (0, 0)
