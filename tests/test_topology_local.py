"""This node's topology through NVML, amdsmi and pyverbs, with fakes shaped like the real
APIs (real pynvml structs and errors), a fake sysfs tree, and the real pyverbs here
(no HCA on this machine: it must say "no RDMA devices")."""

import os

import pytest

from slurmbox.topology import local, nccl_hints, nccl_xml
from slurmbox.topology.local import NoDevices


# -- fake sysfs ---------------------------------------------------------------------------------
def make_sysfs(root, devices):
    """``devices``: {busid: (path of bridges below the root complex, numa)}; creates
    sys/devices/pci.../<bridges>/<busid>, sys/bus/pci/devices/<busid> links and numa_node."""
    sysfs = os.path.join(root, "sys")
    os.makedirs(os.path.join(sysfs, "bus", "pci", "devices"))
    for busid, (chain, numa) in devices.items():
        real = os.path.join(sysfs, "devices", *chain, busid)
        os.makedirs(real)
        with open(os.path.join(real, "numa_node"), "w") as handle:
            handle.write("%d\n" % numa)
        os.symlink(real, os.path.join(sysfs, "bus", "pci", "devices", busid))
    return sysfs


def add_rdma(sysfs, name, busid, netdev=None):
    cls = os.path.join(sysfs, "class", "infiniband", name)
    os.makedirs(cls)
    target = os.path.join(sysfs, "bus", "pci", "devices", busid)
    os.symlink(os.path.realpath(target), os.path.join(cls, "device"))
    if netdev:
        os.makedirs(os.path.join(os.path.realpath(target), "net", netdev))


SYS_DEVICES = {
    # GPU0 and mlx5_0 behind one PCIe switch port pair (PIX); GPU1 deeper under the same switch (PXB);
    # GPU2 on another root complex of NUMA 0 (NODE); mlx5_1 on NUMA 1 (SYS).
    "0000:07:00.0": (["pci0000:00", "0000:00:01.0", "0000:05:00.0"], 0),
    "0000:08:00.0": (["pci0000:00", "0000:00:01.0", "0000:05:00.0"], 0),
    "0000:0c:00.0": (["pci0000:00", "0000:00:01.0", "0000:05:00.0", "0000:0a:00.0"], 0),
    "0000:40:00.0": (["pci0000:3f", "0000:3f:01.0"], 0),
    "0000:c1:00.0": (["pci0000:c0", "0000:c0:01.0"], 1),
}


def test_pci_levels_from_sysfs(tmp_path):
    sysfs = make_sysfs(str(tmp_path), SYS_DEVICES)
    assert local.pci_level("0000:07:00.0", "0000:08:00.0", sysfs) == "PIX"
    assert local.pci_level("0000:0c:00.0", "0000:08:00.0", sysfs) == "PXB"
    assert local.pci_level("0000:07:00.0", "0000:40:00.0", sysfs) == "NODE"
    assert local.pci_level("0000:07:00.0", "0000:c1:00.0", sysfs) == "SYS"
    assert local.pci_level("0000:07:00.0", "0000:99:00.0", sysfs) == "SYS"  # unknown device


# -- NVML ------------------------------------------------------------------------------------------
pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is installed by scripts/install.sh ([nvidia] extra)")


class FakeNvml:
    """The pynvml calls slurmbox makes, answering from a table; structs, constants and
    errors are pynvml's own, so return values have the real shapes."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
    NVML_GPU_FABRIC_STATE_COMPLETED = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS

    def __init__(self, gpus, ancestor=50, init_error=None):
        self.gpus = gpus
        self.ancestor = ancestor
        self.init_error = init_error
        self.shutdown = False

    def nvmlInit(self):
        if self.init_error:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def _pci(self, busid):
        info = pynvml.nvmlPciInfo_t()
        info.busId = busid.encode()
        return info

    def nvmlDeviceGetPciInfo(self, handle):
        return self._pci(self.gpus[handle]["busid"])

    def nvmlDeviceGetUUID(self, handle):
        return "GPU-%08d-0000-0000-0000-000000000000" % handle

    def nvmlDeviceGetNumaNodeId(self, handle):
        if self.gpus[handle].get("numa") is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.gpus[handle]["numa"]

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if link >= len(self.gpus[handle].get("nvlinks", [])):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link):
        return self._pci(self.gpus[handle]["nvlinks"][link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self.ancestor

    def nvmlDeviceGetGpuFabricInfo(self, handle, info):
        fabric = self.gpus[handle].get("fabric")
        if fabric is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        uuid, clique = fabric
        for i, byte in enumerate(bytes.fromhex(uuid.replace("-", ""))):
            info.clusterUuid[i] = byte
        info.cliqueId = clique
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        info.status = pynvml.NVML_SUCCESS
        return pynvml.NVML_SUCCESS


NVSWITCH = "00000000:a1:00.0"


def test_nvml_nvswitch_gpus_and_fabric_info():
    uuid = "5b0e4d52-1c5a-4c0e-9d7e-3b1f6e0a2c11"
    gpus = [{"busid": "00000000:07:00.0", "numa": 0, "nvlinks": [NVSWITCH] * 18, "fabric": (uuid, 32766)},
            {"busid": "00000000:0c:00.0", "numa": 0, "nvlinks": [NVSWITCH] * 18, "fabric": (uuid, 32766)}]
    fake = FakeNvml(gpus)
    node = local.collect_nvidia(fake, "n1")
    assert [g.busid for g in node.gpus] == ["0000:07:00.0", "0000:0c:00.0"]
    assert node.link_counts() == {"NV18": 1}
    assert node.fabric == {"GPU0": (uuid, 32766), "GPU1": (uuid, 32766)}
    assert fake.shutdown


def test_nvml_direct_nvlink_bridge_and_pcie_pairs():
    gpus = [{"busid": "00000000:07:00.0", "nvlinks": ["00000000:0c:00.0"] * 2},
            {"busid": "00000000:0c:00.0", "nvlinks": ["00000000:07:00.0"] * 2},
            {"busid": "00000000:40:00.0"}]
    node = local.collect_nvidia(FakeNvml(gpus, ancestor=pynvml.NVML_TOPOLOGY_NODE), "n1")
    assert node.link("GPU0", "GPU1") == "NV2"  # two bonded links, seen from both ends
    assert node.link("GPU0", "GPU2") == "NODE" and node.gpus[2].numa is None
    assert node.fabric == {}


def test_nvml_missing_library_says_so():
    with pytest.raises(NoDevices, match="no NVIDIA GPUs: NVML did not start"):
        local.collect_nvidia(FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))


def test_nvml_real_library_without_driver_says_no_gpus():
    with pytest.raises(NoDevices, match="no NVIDIA GPUs"):
        local.collect_nvidia()


# -- amdsmi ------------------------------------------------------------------------------------
class FakeAmdSmi:
    """amdsmi's Python API as ROCm 6.x ships it: handles, BDF strings, link type dicts whose
    ``type`` is the module's AmdSmiLinkType enum value."""

    class AmdSmiLinkType:
        AMDSMI_LINK_TYPE_INTERNAL = 0
        AMDSMI_LINK_TYPE_XGMI = 1
        AMDSMI_LINK_TYPE_PCIE = 2

    def __init__(self, bdfs, xgmi=True):
        self.bdfs, self.xgmi = bdfs, xgmi

    def amdsmi_init(self, *flags):
        return None

    def amdsmi_shut_down(self):
        return None

    def amdsmi_get_processor_handles(self):
        return list(range(len(self.bdfs)))

    def amdsmi_get_gpu_device_bdf(self, handle):
        return self.bdfs[handle]

    def amdsmi_topo_get_numa_node_number(self, handle):
        return 0 if handle < 4 else 1

    def amdsmi_topo_get_link_type(self, a, b):
        kind = self.AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI if self.xgmi else self.AmdSmiLinkType.AMDSMI_LINK_TYPE_PCIE
        return {"hops": 1, "type": kind}  # hops read 1 for every XGMI pair: not used

    def amdsmi_topo_get_link_weight(self, a, b):
        return 15 if self.xgmi else 40


MI300X_BDFS = ["0000:0c:00.0", "0000:22:00.0", "0000:38:00.0", "0000:5c:00.0", "0000:9f:00.0", "0000:af:00.0",
               "0000:bf:00.0", "0000:df:00.0"]


def test_amdsmi_xgmi_hive():
    node = local.collect_amd(FakeAmdSmi(MI300X_BDFS), "n1")
    assert node.link_counts() == {"XGMI": 28} and len(node.xgmi_hives()) == 1
    assert set(node.gpu_weights.values()) == {15}


def test_amdsmi_pcie_pairs_by_numa():
    node = local.collect_amd(FakeAmdSmi(MI300X_BDFS, xgmi=False), "n1")
    assert node.link("GPU0", "GPU1") == "NODE" and node.link("GPU0", "GPU7") == "SYS"
    assert node.xgmi_hives() == []


def test_amdsmi_absent_here():
    import importlib.util
    if importlib.util.find_spec("amdsmi") is None:
        with pytest.raises(NoDevices, match="amdsmi Python package is not installed"):
            local.collect_amd()
    else:
        pytest.skip("amdsmi is installed here; its real behaviour depends on the GPUs present")


# -- pyverbs ------------------------------------------------------------------------------------
class FakeVerbs:
    """pyverbs.device as rdma-core 44 shapes it: get_device_list() -> Device (name bytes),
    Context(name=...).query_device() -> DeviceAttr (node_guid text, phys_port_cnt),
    query_port(n) -> PortAttr (state, link_layer ints), query_gid(port, i) -> GID (.gid text),
    query_gid_type(port, i) -> int."""

    class Device:
        def __init__(self, name):
            self.name = name.encode()

    class Obj:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    def __init__(self, hcas):
        self.hcas = hcas
        self.closed = []
        verbs = self

        class Context:
            def __init__(self, name):
                self.hca = verbs.hcas[name]
                self.name = name

            def query_device(self):
                return FakeVerbs.Obj(node_guid=self.hca["guid"], phys_port_cnt=len(self.hca["ports"]),
                                     vendor_part_id=4123)

            def query_port(self, number):
                port = self.hca["ports"][number - 1]
                return FakeVerbs.Obj(state=port["state"], link_layer=port["ll"], lid=port.get("lid", 0),
                                     sm_lid=port.get("sm_lid", 0), gid_tbl_len=len(port["gids"]))

            def query_gid(self, port, index):
                return FakeVerbs.Obj(gid=self.hca["ports"][port - 1]["gids"][index][0])

            def query_gid_type(self, port, index):
                return self.hca["ports"][port - 1]["gids"][index][1]

            def close(self):
                verbs.closed.append(self.name)

        self.Context = Context

    def get_device_list(self):
        return [self.Device(n) for n in self.hcas]


ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _fake_hcas():
    return {
        "mlx5_0": {"guid": "506b:4b03:00f9:f8ea", "ports": [
            {"state": 4, "ll": 1, "lid": 59, "sm_lid": 10, "gids": [("fe80:0000:0000:0000:506b:4b03:00f9:f8ea", 0)]}]},
        "mlx5_1": {"guid": "506b:4b03:00f9:fa6b", "ports": [
            {"state": 4, "ll": 2, "gids": [("fe80:0000:0000:0000:526b:4bff:fef9:fa6b", 1),
                                           ("fe80:0000:0000:0000:526b:4bff:fef9:fa6b", 2),
                                           (ZERO_GID, 0),
                                           ("0000:0000:0000:0000:0000:ffff:0a00:0005", 1),
                                           ("0000:0000:0000:0000:0000:ffff:0a00:0005", 2)]}]},
    }


def test_pyverbs_ports_link_layers_and_gid_table(tmp_path):
    sysfs = make_sysfs(str(tmp_path), SYS_DEVICES)
    add_rdma(sysfs, "mlx5_0", "0000:08:00.0")
    add_rdma(sysfs, "mlx5_1", "0000:c1:00.0", netdev="ens1f1np1")
    fake = FakeVerbs(_fake_hcas())
    nics = local.collect_verbs(fake, sysfs)
    assert [(n.name, n.busid, n.link_layer, n.netdev) for n in nics] == [
        ("mlx5_0", "0000:08:00.0", "InfiniBand", None), ("mlx5_1", "0000:c1:00.0", "Ethernet", "ens1f1np1")]
    assert nics[0].node_guid == 0x506b4b0300f9f8ea and nics[0].ports[0].lid == 59
    roce = nics[1].ports[0]
    assert [i for i, _, _ in roce.gids] == [0, 1, 3, 4]  # the all-zero entry is skipped
    assert roce.roce_v2_gid_index() == 4
    assert sorted(fake.closed) == ["mlx5_0", "mlx5_1"]


def test_pyverbs_no_devices_is_clean():
    class Empty:
        def get_device_list(self):
            return []
    with pytest.raises(NoDevices, match="^no RDMA devices$"):
        local.collect_verbs(Empty())


def test_real_pyverbs_on_a_machine_without_hca():
    import importlib.util
    if importlib.util.find_spec("pyverbs") is None:
        pytest.skip("pyverbs is not visible in this venv (scripts/install.sh links it)")
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        pytest.skip("this machine has RDMA devices")
    with pytest.raises(NoDevices, match="no RDMA devices"):
        local.collect_verbs()


# -- everything together: a node file for NCCL ----------------------------------------------------
def test_collect_local_gives_nccl_xml_with_sysfs_pairing(tmp_path):
    sysfs = make_sysfs(str(tmp_path), SYS_DEVICES)
    add_rdma(sysfs, "mlx5_0", "0000:08:00.0")
    add_rdma(sysfs, "mlx5_1", "0000:c1:00.0", netdev="ens1f1np1")
    gpus = [{"busid": "00000000:07:00.0", "numa": 0}, {"busid": "00000000:0c:00.0", "numa": 0},
            {"busid": "00000000:40:00.0", "numa": 0}]
    node, notes = local.collect_local("n1", nvml=FakeNvml(gpus, ancestor=pynvml.NVML_TOPOLOGY_NODE),
                                      verbs=FakeVerbs(_fake_hcas()), sysfs=sysfs)
    assert notes == []
    assert node.gpu_nic[("GPU0", "mlx5_0")] == "PIX" and node.gpu_nic[("GPU1", "mlx5_0")] == "PXB"
    assert node.gpu_nic[("GPU2", "mlx5_0")] == "NODE" and node.gpu_nic[("GPU0", "mlx5_1")] == "SYS"
    again = nccl_xml.parse(nccl_xml.to_xml(node))
    assert nccl_xml.nearest_nic_busids(again) == {"0000:07:00.0": ["0000:08:00.0"],
                                                  "0000:0c:00.0": ["0000:08:00.0"],
                                                  "0000:40:00.0": ["0000:08:00.0"]}
    assert nccl_hints.step_hints(node, [0])["NCCL_IB_HCA"] == "=mlx5_0:1"


def test_collect_local_nothing_found():
    class Empty:
        def get_device_list(self):
            return []
    with pytest.raises(NoDevices, match="nothing found on this node"):
        local.collect_local("n1", nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
                            amdsmi=FakeAmdSmi([]), verbs=Empty())
