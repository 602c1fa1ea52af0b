"""The one small interface slurmbox has over the vendor hardware libraries.

Three probes, each taking the library module (tests pass fakes shaped like the
real ones; None means "not installed") and never raising:

- ``probe_nvidia(pynvml)``: NVML through nvidia-ml-py (module ``pynvml``):
  ``nvmlInit``, ``nvmlSystemGetDriverVersion``, ``nvmlDeviceGetCount``,
  ``nvmlDeviceGetHandleByIndex``, ``nvmlDeviceGetName``,
  ``nvmlDeviceGetMinorNumber``, ``nvmlDeviceGetUUID``,
  ``nvmlDeviceGetPciInfo(h).busId``, ``nvmlDeviceGetAPIRestriction(h,
  NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS)`` (NVML_FEATURE_ENABLED = only
  root may change clocks), ``nvmlShutdown``; errors are ``NVMLError`` with
  ``.value`` (nvml.h ``nvmlReturn_t``: 9 driver not loaded, 12 library not
  found). Strings come back as ``str`` (nvidia-ml-py >= 11.5) or ``bytes``.
- ``probe_amd(amdsmi)``: AMD SMI (module ``amdsmi``, ROCm/amdsmi
  py-interface): ``amdsmi_init``, ``amdsmi_get_processor_handles``,
  ``amdsmi_get_gpu_asic_info`` (dict with ``market_name``),
  ``amdsmi_get_gpu_device_bdf``, ``amdsmi_get_gpu_driver_info`` (dict with
  ``driver_version``), ``amdsmi_shut_down``; errors derive from
  ``AmdSmiException`` (``AmdSmiLibraryException`` has ``err_code``).
- ``probe_rdma(verbs)``: RDMA ports through pyverbs (rdma-core;
  ``verbs.device.get_device_list()`` -> devices with ``.name`` bytes,
  ``verbs.device.Context(name=...)`` with ``query_device().phys_port_cnt``
  and ``query_port(n)`` -> ``.state``/``.link_layer``; constants in
  ``verbs.enums``: ``IBV_PORT_*``, ``IBV_LINK_LAYER_*``, verbs.h). On a
  machine without RDMA devices the real ``get_device_list`` raises
  ``PyverbsRDMAError('Failed to get devices list')``.

``import_nvml``/``import_amdsmi``/``import_pyverbs`` return the real module or
None; importing a vendor library may also fail with OSError when its shared
library is missing, which counts as not installed.
"""

import glob
import importlib
import os
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

MISSING, FAILED, OK = "missing", "failed", "ok"
#: Debian's python3-pyverbs location (rdma-core ships no PyPI package).
DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"


@dataclass
class Gpu:
    """One accelerator as its vendor library reports it."""

    index: int
    name: str
    bus_id: str = ""
    minor: int = None
    uuid: str = ""


@dataclass
class Probe:
    """What a vendor library said: ``state`` missing|failed|ok, ``library``
    (package name), ``detail`` (error text when failed), ``driver_version``,
    ``devices`` (Gpu list), ``clocks_restricted`` (NVIDIA: True when only root
    may set clocks, None when unknown), ``error_code`` (library's code)."""

    library: str
    state: str
    detail: str = ""
    driver_version: str = ""
    devices: list = field(default_factory=list)
    clocks_restricted: bool = None
    error_code: int = None


@dataclass
class RdmaPort:
    """One RDMA port: device name, port number, state (ACTIVE, DOWN, ...) and
    link layer (InfiniBand, Ethernet, unspecified)."""

    device: str
    port: int
    state: str
    link_layer: str


@dataclass
class RdmaProbe:
    """``state`` missing|failed|ok, ``detail``, and the ports found."""

    state: str
    detail: str = ""
    ports: list = field(default_factory=list)


def _text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _import(name):
    try:
        return importlib.import_module(name)
    except (ImportError, OSError, KeyError, AttributeError):
        return None


def import_nvml():
    """The real ``pynvml`` module of nvidia-ml-py, or None."""
    return _import("pynvml")


def import_amdsmi():
    """The real ``amdsmi`` module, or None (also when libamd_smi.so is missing)."""
    return _import("amdsmi")


def import_pyverbs():
    """Namespace(device, enums, pyverbs_error) of the real pyverbs, or None.

    Falls back to Debian's python3-pyverbs when its extension modules are
    built for this interpreter's version (the venv does not see dist-packages).
    """
    names = ("pyverbs.device", "pyverbs.enums", "pyverbs.pyverbs_error")
    modules = [_import(n) for n in names]
    if None in modules:
        tag = "cpython-%d%d" % sys.version_info[:2]
        if glob.glob(os.path.join(DEBIAN_DIST_PACKAGES, "pyverbs", "device.%s-*.so" % tag)) and \
                DEBIAN_DIST_PACKAGES not in sys.path:
            sys.path.append(DEBIAN_DIST_PACKAGES)  # last: the venv's own packages still win
            for name in ("pyverbs",) + names:
                sys.modules.pop(name, None)
            modules = [_import(n) for n in names]
    if None in modules:
        return None
    return SimpleNamespace(device=modules[0], enums=modules[1], pyverbs_error=modules[2])


def probe_nvidia(nvml):
    """Probe of NVIDIA GPUs through ``nvml`` (pynvml or a fake; None = not installed)."""
    if nvml is None:
        return Probe("nvidia-ml-py", MISSING, "the Python module pynvml (package nvidia-ml-py) is not installed")
    try:
        nvml.nvmlInit()
    except Exception as err:  # NVMLError and anything else the library raises: never a traceback
        return Probe("nvidia-ml-py", FAILED, "nvmlInit failed: %s" % err, error_code=getattr(err, "value", None))
    probe = Probe("nvidia-ml-py", OK)
    try:
        probe.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        restricted = set()
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            probe.devices.append(Gpu(index, _text(nvml.nvmlDeviceGetName(handle)),
                                     _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                                     int(nvml.nvmlDeviceGetMinorNumber(handle)),
                                     _text(nvml.nvmlDeviceGetUUID(handle))))
            try:
                state = nvml.nvmlDeviceGetAPIRestriction(handle, nvml.NVML_RESTRICTED_API_SET_APPLICATION_CLOCKS)
                restricted.add(state == nvml.NVML_FEATURE_ENABLED)
            except Exception:
                restricted.add(None)
        if restricted and None not in restricted:
            probe.clocks_restricted = True in restricted
    except Exception as err:
        probe.state, probe.detail = FAILED, "NVML query failed: %s" % err
        probe.error_code = getattr(err, "value", None)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return probe


def probe_amd(amdsmi):
    """Probe of AMD GPUs through ``amdsmi`` (the ROCm module or a fake; None = not installed)."""
    if amdsmi is None:
        return Probe("amdsmi", MISSING, "the Python module amdsmi (ROCm's AMD SMI) is not installed")
    try:
        flags = getattr(getattr(amdsmi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
        amdsmi.amdsmi_init(flags) if flags is not None else amdsmi.amdsmi_init()
    except Exception as err:
        return Probe("amdsmi", FAILED, "amdsmi_init failed: %s" % err, error_code=getattr(err, "err_code", None))
    probe = Probe("amdsmi", OK)
    try:
        for index, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
            asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
            probe.devices.append(Gpu(index, _text(asic.get("market_name", "AMD GPU")),
                                     _text(amdsmi.amdsmi_get_gpu_device_bdf(handle))))
            if not probe.driver_version:
                probe.driver_version = _text(amdsmi.amdsmi_get_gpu_driver_info(handle).get("driver_version", ""))
    except Exception as err:
        probe.state, probe.detail = FAILED, "AMD SMI query failed: %s" % err
        probe.error_code = getattr(err, "err_code", None)
    finally:
        try:
            amdsmi.amdsmi_shut_down()
        except Exception:
            pass
    return probe


def _enum_name(enums, prefix, value, names):
    for name in names:
        if getattr(enums, prefix + name, object()) == value:
            return name
    return "unknown(%s)" % value


_PORT_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")
_LINK_LAYERS = {"INFINIBAND": "InfiniBand", "ETHERNET": "Ethernet", "UNSPECIFIED": "unspecified"}


def probe_rdma(verbs):
    """RDMA ports through ``verbs`` (see import_pyverbs; None = not installed)."""
    if verbs is None:
        return RdmaProbe(MISSING, "pyverbs (Debian package python3-pyverbs, from rdma-core) is not installed")
    try:
        devices = verbs.device.get_device_list()
    except Exception as err:
        return RdmaProbe(FAILED, "no RDMA devices: %s" % err)
    probe = RdmaProbe(OK)
    for dev in devices:
        name = _text(dev.name)
        try:
            ctx = verbs.device.Context(name=name)
        except Exception as err:
            probe.state, probe.detail = FAILED, "cannot open RDMA device %s: %s" % (name, err)
            continue
        try:
            for port in range(1, int(ctx.query_device().phys_port_cnt) + 1):
                attr = ctx.query_port(port)
                layer = _enum_name(verbs.enums, "IBV_LINK_LAYER_", attr.link_layer, _LINK_LAYERS)
                probe.ports.append(RdmaPort(name, port, _enum_name(verbs.enums, "IBV_PORT_", attr.state,
                                                                   _PORT_STATES),
                                            _LINK_LAYERS.get(layer, layer)))
        except Exception as err:
            probe.state, probe.detail = FAILED, "querying RDMA device %s failed: %s" % (name, err)
        finally:
            try:
                ctx.close()
            except Exception:
                pass
    return probe
