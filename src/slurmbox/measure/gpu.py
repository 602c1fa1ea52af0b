"""GPU state through NVML (nvidia-ml-py, ``import pynvml``), read by the root-run harness only.

One small interface over NVML (docs.nvidia.com/deploy/nvml-api): the
fingerprint of each visible device (UUID, driver, clocks, ECC, MIG mode,
power limit), per-sample clock/throttle readings (throttled samples are
discarded and counted), and clock locking for sites whose measurement
policy says ``clock_policy: locked`` (nvmlDeviceSetGpuLockedClocks /
nvmlDeviceResetGpuLockedClocks, root only; never from inside a sandbox).
Without nvidia-ml-py or without a driver every function reports "not
present" instead of failing.
"""

#: clocksThrottleReasons bits that mean the sample ran below its clocks
#: (nvml.h NVML_CLOCKS_THROTTLE_REASON_*; GPU idle 0x1 and app-clock setting 0x2 excluded).
THROTTLE_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sync_boost", 0x40: "sw_thermal",
                 0x80: "hw_thermal", 0x100: "hw_power_brake", 0x200: "display_clock"}


def _nvml():
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as err:  # pynvml.NVMLError, driver missing
        return None, "NVML unavailable: %s" % err
    return pynvml, ""


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def fingerprint(indices=None):
    """``{"present": bool, "reason": str, "devices": [...]}``: per device uuid, name, driver,
    sm/mem clocks (MHz), ECC mode, MIG mode, power limit (W)."""
    nvml, reason = _nvml()
    if nvml is None:
        return {"present": False, "reason": reason, "devices": []}
    devices = []
    try:
        count = nvml.nvmlDeviceGetCount()
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        for index in (indices if indices is not None else range(count)):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            entry = {"index": index, "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                     "name": _text(nvml.nvmlDeviceGetName(handle)), "driver": driver}
            for key, call in (("sm_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
                              ("mem_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
                              ("ecc", lambda: nvml.nvmlDeviceGetEccMode(handle)[0]),
                              ("mig", lambda: nvml.nvmlDeviceGetMigMode(handle)[0]),
                              ("power_limit_w", lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0)):
                try:
                    entry[key] = call()
                except Exception as err:  # not supported on this board
                    entry[key] = "n/a (%s)" % err
            devices.append(entry)
    finally:
        nvml.nvmlShutdown()
    return {"present": True, "reason": "", "devices": devices}


class ThrottleMonitor:
    """Per-sample throttle and clock readings of the devices ``indices``; without NVML it records nothing.

    ``read()`` returns the OR of throttle bits of THROTTLE_BITS over the
    devices (0 = clean) and remembers the lowest SM clock (MHz) in
    ``last_sm_mhz`` (-1 without NVML); ``histogram`` counts samples per reason name.
    """

    last_sm_mhz = -1

    def __init__(self, indices=()):
        self.nvml, self.reason = _nvml() if indices else (None, "no GPU requested")
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in indices] if self.nvml else []
        self.histogram = {}

    def read(self):
        """Throttle-reason bits (NVML nvmlClocksThrottleReasons, nvml.h) OR-ed over the GPUs,
        masked to THROTTLE_BITS; also sets ``last_sm_mhz`` (lowest SM clock, MHz; -1 without
        GPUs) and counts each reason in ``histogram``. NVML errors pass through."""
        bits = 0
        clocks = []
        for handle in self.handles:
            bits |= self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
            clocks.append(self.nvml.nvmlDeviceGetClockInfo(handle, self.nvml.NVML_CLOCK_SM))
        self.last_sm_mhz = min(clocks) if clocks else -1
        bits &= sum(THROTTLE_BITS)
        for bit, name in THROTTLE_BITS.items():
            if bits & bit:
                self.histogram[name] = self.histogram.get(name, 0) + 1
        return bits

    def close(self):
        """Shut NVML down (nvmlShutdown) if this monitor initialised it."""
        if self.nvml is not None:
            self.nvml.nvmlShutdown()
            self.nvml = None


def foreign_processes(indices):
    """``{index: [pid, ...]}`` of compute processes NVML sees on devices ``indices``
    (nvmlDeviceGetComputeRunningProcesses); {} without NVML."""
    nvml, _ = _nvml()
    if nvml is None:
        return {}
    try:
        found = {}
        for index in indices:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            pids = [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            if pids:
                found[index] = pids
        return found
    finally:
        nvml.nvmlShutdown()


def lock_clocks(indices, sm_mhz):
    """Lock the SM clock of devices ``indices`` at ``sm_mhz`` (root; a prolog's job).

    ``sm_mhz`` 0 means the device's default application clock
    (nvmlDeviceGetDefaultApplicationsClock, NVML_CLOCK_GRAPHICS). Returns
    {index: MHz locked}. Raises RuntimeError without NVML or when the driver refuses.
    """
    nvml, reason = _nvml()
    if nvml is None:
        raise RuntimeError("cannot lock GPU clocks: %s" % reason)
    locked = {}
    try:
        for index in indices:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mhz = sm_mhz or nvml.nvmlDeviceGetDefaultApplicationsClock(handle, nvml.NVML_CLOCK_GRAPHICS)
            nvml.nvmlDeviceSetGpuLockedClocks(handle, mhz, mhz)
            locked[index] = mhz
    except Exception as err:  # pynvml.NVMLError (e.g. NoPermission: not root)
        raise RuntimeError("cannot lock GPU clocks: %s" % err)
    finally:
        nvml.nvmlShutdown()
    return locked


def reset_clocks(indices):
    """Undo lock_clocks (an epilog's job). Raises RuntimeError without NVML."""
    nvml, reason = _nvml()
    if nvml is None:
        raise RuntimeError("cannot reset GPU clocks: %s" % reason)
    try:
        for index in indices:
            nvml.nvmlDeviceResetGpuLockedClocks(nvml.nvmlDeviceGetHandleByIndex(index))
    finally:
        nvml.nvmlShutdown()
