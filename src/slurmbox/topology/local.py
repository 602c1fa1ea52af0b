"""This node's GPUs and NICs through the vendor libraries, behind one small interface.

- NVIDIA through NVML (PyPI ``nvidia-ml-py``, module ``pynvml``): GPUs, PCI bus ids,
  NUMA nodes, NVLink state and peers (``nvmlDeviceGetNvLinkState``/``...RemotePciInfo``),
  fabric info (``nvmlDeviceGetGpuFabricInfo``: clusterUuid/cliqueId) and GPU pair levels
  (``nvmlDeviceGetTopologyCommonAncestor``: NVML_TOPOLOGY_SINGLE=10 -> PIX, MULTIPLE=20 ->
  PXB, HOSTBRIDGE=30 -> PHB, NODE=40 -> NODE, SYSTEM=50 -> SYS; nvml.h).
- AMD through ``amdsmi`` (optional; ROCm's Python package): GPUs, BDFs, XGMI links
  (``amdsmi_topo_get_link_type``) and weights.
- HCAs through ``pyverbs`` (Debian python3-pyverbs, rdma-core): ports, state, link layer,
  LIDs and the GID table with GID types (RoCE v2 index for NCCL_IB_GID_INDEX).
- NIC PCI addresses, NUMA nodes and GPU<->NIC levels from sysfs
  (``/sys/class/infiniband/<dev>/device``, ``/sys/bus/pci/devices/<bdf>``).

Each collector takes the library module as an argument (default: the real import), so
tests pass small fakes shaped like the real API. A missing library or no device gives
:class:`NoDevices` with a message saying so; nothing here needs a GPU or an HCA to import.
"""

import os

from .model import Gpu, Nic, NicPort, NodeTopology, TopologyError

NVML_LEVELS = {10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# ibv_port_state / ibv_link_layer (infiniband/verbs.h).
PORT_STATES = {1: "Down", 2: "Initializing", 3: "Armed", 4: "Active", 5: "Active"}
LINK_LAYERS = {0: None, 1: "InfiniBand", 2: "Ethernet"}
# ibv_gid_type (IBV_GID_TYPE_IB=0, IBV_GID_TYPE_ROCE_V1=1, IBV_GID_TYPE_ROCE_V2=2).
GID_TYPES = {0: "IB", 1: "RoCE v1", 2: "RoCE v2"}
MAX_GIDS = 64


class NoDevices(TopologyError):
    """The library is absent or reports no device (``str()`` says which)."""


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_busid(busid):
    """NVML's ``00000000:07:00.0`` (8-digit domain) -> ``0000:07:00.0`` (sysfs form)."""
    busid = _text(busid).strip().lower()
    domain, _, rest = busid.partition(":")
    try:
        return "%04x:%s" % (int(domain, 16), rest)
    except ValueError:
        return busid


# -- NVIDIA ----------------------------------------------------------------------------------
def collect_nvidia(nvml=None, host=None):
    """NodeTopology of this node's NVIDIA GPUs via NVML (``nvml``: the pynvml module).

    Raises NoDevices when nvidia-ml-py or the driver library is missing or no GPU exists.
    """
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            raise NoDevices("no NVIDIA GPUs: nvidia-ml-py is not installed (pip install 'slurmbox[nvidia]')")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        raise NoDevices("no NVIDIA GPUs: NVML did not start (%s)" % err)
    try:
        count = nvml.nvmlDeviceGetCount()
        if not count:
            raise NoDevices("no NVIDIA GPUs: NVML reports none")
        node = NodeTopology(host)
        handles = []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            handles.append(handle)
            busid = normalize_busid(nvml.nvmlDeviceGetPciInfo(handle).busId)
            try:
                numa = nvml.nvmlDeviceGetNumaNodeId(handle)
            except nvml.NVMLError:
                numa = None
            node.gpus.append(Gpu(index, "GPU%d" % index, busid=busid, numa=numa, vendor="nvidia",
                                 uuid=_text(nvml.nvmlDeviceGetUUID(handle))))
            info = _fabric_info(nvml, handle)
            if info is not None:
                node.fabric["GPU%d" % index] = info
        by_bus = {g.busid: g.name for g in node.gpus}
        peers, switch_links = {}, {}
        for gpu, handle in zip(node.gpus, handles):
            for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(handle, link) != 1:
                        continue
                    remote = normalize_busid(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
                except nvml.NVMLError:
                    continue  # link index past this GPU's links, or NVLink unsupported
                if remote in by_bus:
                    pair = tuple(sorted((gpu.name, by_bus[remote])))
                    peers[pair] = peers.get(pair, 0) + 1
                else:
                    switch_links[gpu.name] = switch_links.get(gpu.name, 0) + 1
        for i, a in enumerate(node.gpus):
            for b, hb in zip(node.gpus[i + 1:], handles[i + 1:]):
                pair = (a.name, b.name)
                if pair in peers:
                    node.set_link(a.name, b.name, "NV%d" % (peers[pair] // 2 or peers[pair]))
                elif a.name in switch_links and b.name in switch_links:
                    node.set_link(a.name, b.name, "NV%d" % min(switch_links[a.name], switch_links[b.name]))
                else:
                    level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], hb)
                    node.set_link(a.name, b.name, NVML_LEVELS.get(level, "PIX" if level == 0 else "SYS"))
        return node
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _fabric_info(nvml, handle):
    """(cluster_uuid text, clique_id) when the GPU is in a completed NVLink fabric, else None."""
    if not hasattr(nvml, "nvmlDeviceGetGpuFabricInfo"):
        return None
    info = nvml.c_nvmlGpuFabricInfo_t()
    try:
        nvml.nvmlDeviceGetGpuFabricInfo(handle, info)
    except nvml.NVMLError:
        return None  # not an NVLink-fabric GPU (pre-Hopper, or no NVSwitch fabric)
    if info.state != getattr(nvml, "NVML_GPU_FABRIC_STATE_COMPLETED", 3) or info.status != 0:
        return None
    raw = bytes(bytearray(info.clusterUuid))
    if not any(raw):
        return None
    hexed = raw.hex()
    uuid = "%s-%s-%s-%s-%s" % (hexed[:8], hexed[8:12], hexed[12:16], hexed[16:20], hexed[20:32])
    return (uuid, int(info.cliqueId))


# -- AMD -------------------------------------------------------------------------------------
def collect_amd(amdsmi=None, host=None):
    """NodeTopology of this node's AMD GPUs via amdsmi; NoDevices when absent."""
    if amdsmi is None:
        try:
            import amdsmi
        except ImportError:
            raise NoDevices("no AMD GPUs: the amdsmi Python package is not installed (ROCm)")
    try:
        amdsmi.amdsmi_init()
    except Exception as err:  # amdsmi raises AmdSmiLibraryException and friends
        raise NoDevices("no AMD GPUs: amdsmi did not start (%s)" % err)
    try:
        handles = amdsmi.amdsmi_get_processor_handles()
        if not handles:
            raise NoDevices("no AMD GPUs: amdsmi reports none")
        node = NodeTopology(host)
        for index, handle in enumerate(handles):
            node.gpus.append(Gpu(index, "GPU%d" % index, busid=_text(amdsmi.amdsmi_get_gpu_device_bdf(handle)),
                                 numa=_try(lambda: amdsmi.amdsmi_topo_get_numa_node_number(handle)), vendor="amd"))
        for i, a in enumerate(handles):
            for j in range(i + 1, len(handles)):
                b = handles[j]
                link = amdsmi.amdsmi_topo_get_link_type(a, b)
                kind = link.get("type") if isinstance(link, dict) else link
                na, nb = node.gpus[i], node.gpus[j]
                if _is_xgmi(amdsmi, kind):
                    node.set_link(na.name, nb.name, "XGMI")
                else:
                    node.set_link(na.name, nb.name, "NODE" if na.numa is not None and na.numa == nb.numa else "SYS")
                weight = _try(lambda: amdsmi.amdsmi_topo_get_link_weight(a, b))
                if isinstance(weight, int):
                    node.gpu_weights[(na.name, nb.name)] = weight
        return node
    finally:
        try:
            amdsmi.amdsmi_shut_down()
        except Exception:
            pass


def _is_xgmi(amdsmi, kind):
    """Whether a link type from amdsmi_topo_get_link_type is XGMI. The enum's numbering
    changed between amdsmi releases (the changelog notes XGMI and PCIE were reordered), so
    compare with the installed module's own enum, never a literal number."""
    for enum, member in (("AmdSmiLinkType", "AMDSMI_LINK_TYPE_XGMI"), ("AmdSmiIoLinkType", "XGMI")):
        xgmi = getattr(getattr(amdsmi, enum, None), member, None)
        if xgmi is not None:
            try:
                return int(kind) == int(xgmi)
            except (TypeError, ValueError):
                return False
    return "XGMI" in getattr(kind, "name", str(kind)).upper()


def _try(call):
    try:
        return call()
    except Exception:
        return None


# -- RDMA (pyverbs) -----------------------------------------------------------------------------
def collect_verbs(verbs=None, sysfs="/sys"):
    """List of Nic for this node's RDMA devices via pyverbs (``verbs``: the
    ``pyverbs.device`` module). Raises NoDevices("no RDMA devices ...") when pyverbs is
    missing or finds no device (pyverbs raises when the device list is empty)."""
    if verbs is None:
        try:
            import pyverbs.device as verbs
        except ImportError:
            raise NoDevices("no RDMA devices: pyverbs is not installed (Debian package python3-pyverbs)")
    try:
        devices = verbs.get_device_list()
    except Exception as err:  # PyverbsRDMAError "Failed to get devices list" when there is none
        raise NoDevices("no RDMA devices (%s)" % err)
    if not devices:
        raise NoDevices("no RDMA devices")
    nics = []
    for dev in devices:
        name = _text(dev.name)
        ctx = verbs.Context(name=name)
        try:
            attr = ctx.query_device()
            busid = nic_busid(name, sysfs)
            nic = Nic(name, busid=busid, node_guid=_guid(attr.node_guid), netdev=_netdev(name, sysfs),
                      ca_type="MT%s" % attr.vendor_part_id, numa=pci_numa(busid, sysfs) if busid else None)
            for number in range(1, attr.phys_port_cnt + 1):
                pattr = ctx.query_port(number)
                port = NicPort(number, PORT_STATES.get(pattr.state, str(pattr.state)),
                               LINK_LAYERS.get(pattr.link_layer), lid=pattr.lid, sm_lid=pattr.sm_lid)
                for index in range(min(pattr.gid_tbl_len, MAX_GIDS)):
                    try:
                        gid = _text(ctx.query_gid(number, index).gid)
                    except Exception:
                        continue
                    if not gid.replace("0", "").replace(":", ""):
                        continue
                    try:
                        kind = GID_TYPES.get(ctx.query_gid_type(number, index), "IB")
                    except Exception:
                        kind = "IB" if port.link_layer == "InfiniBand" else "RoCE v1"
                    port.gids.append((index, gid, kind))
                nic.ports.append(port)
        finally:
            ctx.close()
        nics.append(nic)
    return nics


def _guid(value):
    if isinstance(value, int):
        return value
    text = _text(value).replace(":", "")
    try:
        return int(text, 16)
    except ValueError:
        return None


def nic_busid(name, sysfs="/sys"):
    """PCI address of RDMA device ``name`` from sysfs, or None."""
    path = os.path.join(sysfs, "class", "infiniband", name, "device")
    return os.path.basename(os.path.realpath(path)) if os.path.exists(path) else None


def _netdev(name, sysfs):
    path = os.path.join(sysfs, "class", "infiniband", name, "device", "net")
    try:
        found = sorted(os.listdir(path))
    except OSError:
        return None
    return found[0] if found else None


# -- PCI levels from sysfs ----------------------------------------------------------------------
def pci_path(busid, sysfs="/sys"):
    """Ancestors of PCI device ``busid``: ["pci0000:00", bridge, ..., busid], or None."""
    path = os.path.join(sysfs, "bus", "pci", "devices", busid)
    if not os.path.exists(path):
        return None
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    for i, part in enumerate(parts):
        if part.startswith("pci"):
            return parts[i:]
    return None


def pci_numa(busid, sysfs="/sys"):
    """NUMA node of PCI device ``busid`` (int) or None when unknown (-1 or unreadable)."""
    try:
        with open(os.path.join(sysfs, "bus", "pci", "devices", busid, "numa_node")) as handle:
            value = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def pci_level(a, b, sysfs="/sys"):
    """nvidia-smi level between PCI devices ``a`` and ``b`` (bus ids) from sysfs:
    PIX (same parent bridge), PXB (a deeper common bridge), PHB (same root complex only),
    NODE (same NUMA node), SYS (otherwise or unknown)."""
    pa, pb = pci_path(a, sysfs), pci_path(b, sysfs)
    if pa is None or pb is None:
        return "SYS"
    if pa[0] != pb[0]:
        na, nb = pci_numa(a, sysfs), pci_numa(b, sysfs)
        return "NODE" if na is not None and na == nb else "SYS"
    common = 0
    for x, y in zip(pa[:-1], pb[:-1]):
        if x != y:
            break
        common += 1
    if common <= 1:
        return "PHB"
    if common == len(pa) - 1 == len(pb) - 1:
        return "PIX"
    return "PXB"


def collect_local(host, nvml=None, amdsmi=None, verbs=None, sysfs="/sys"):
    """NodeTopology of this node from every library present, plus the notes (list of str)
    of the sources that found nothing ("no RDMA devices ..."). GPU<->NIC levels come
    from sysfs. Raises NoDevices only when no source found anything."""
    notes = []
    node = None
    for collect, lib in ((collect_nvidia, nvml), (collect_amd, amdsmi)):
        try:
            node = collect(lib, host)
            break
        except NoDevices as err:
            notes.append(str(err))
    node = node or NodeTopology(host)
    try:
        node.nics = collect_verbs(verbs, sysfs)
    except NoDevices as err:
        notes.append(str(err))
    if not node.gpus and not node.nics:
        raise NoDevices("nothing found on this node: " + "; ".join(notes))
    for gpu in node.gpus:
        for nic in node.nics:
            if gpu.busid and nic.busid:
                node.gpu_nic[(gpu.name, nic.name)] = pci_level(gpu.busid, nic.busid, sysfs)
    return node, notes
