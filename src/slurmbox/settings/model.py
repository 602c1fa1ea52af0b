"""The admin-written site configuration (YAML), validated with pydantic.

One document describes a site: the cluster name, node groups (hostlist,
accelerator vendor/model/count/device files, CPUs, memory in MB, features),
partitions (node groups, spot or on-demand, Slurm preemption settings,
sandbox policy, checkpoint policy), sandbox profiles, the checkpoint store,
the measurement policy, where slurmbox is installed (for the plugstack.conf
line) and cgroup settings. Slurm's terms and units are used throughout:
memory in MB (slurm.conf ``RealMemory``), ``grace_time`` in seconds as
slurm.conf ``GraceTime`` (or a Slurm time string), ``max_time`` and
checkpoint ``interval`` in minutes as Slurm times (or a Slurm time string).
See ``site-configs/*.yaml`` for complete examples. The smallest valid
document is::

    cluster: demo
    profiles:
      default: {network: none, allowed_networks: [none, sandbox]}
    partitions:
      secure: {sandbox: required, default_profile: default}

Unknown keys are errors. ``load_site`` returns the model or raises
SiteConfigError whose ``details`` are (key path, line, message) triples;
``compile_policy``/``compile_site`` give the standard-library ``SitePolicy``
that ``slurmbox.settings.compiled`` caches for the step start path.
"""

import re
import typing
from typing import Dict, List, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from slurmbox.settings import slurm_syntax
from slurmbox.settings.slurm_syntax import SyntaxProblem

NetworkMode = Literal["none", "sandbox", "host"]
Vendor = Literal["nvidia", "amd", "tpu", "trainium"]
SlurmTime = Union[int, str]

#: Device file base names per vendor (as slurmbox.sandbox.devices maps them).
DEVICE_NAME_PATTERNS = {
    "nvidia": re.compile(r"^nvidia\d+$"),
    "amd": re.compile(r"^renderD\d+$"),
    "tpu": re.compile(r"^(accel\d+|vfio\d+)$"),
    "trainium": re.compile(r"^neuron\d+$"),
}
#: Default gres.conf File= per vendor for ``count`` devices.
DEFAULT_DEVICE_FILES = {
    "nvidia": lambda n: "/dev/nvidia[0-%d]" % (n - 1),
    "amd": lambda n: "/dev/dri/renderD[128-%d]" % (127 + n),
    "tpu": lambda n: "/dev/accel[0-%d]" % (n - 1),
    "trainium": lambda n: "/dev/neuron[0-%d]" % (n - 1),
}
#: Checkpoint image compressions slurmbox can ask of ``runsc checkpoint -compression``
#: (slurmbox.migrate.store.IMAGE_COMPRESSIONS; runsc builds without the flag always write flate).
SUPPORTED_COMPRESSION = ("none", "flate-best-speed")
#: runsc flags slurmbox sets itself (sandbox/runsc.py, sandbox/supervisor.py); a profile may not override them.
RESERVED_RUNSC_FLAGS = {
    "root": "each node's runsc state directory is slurmbox's",
    "platform": "use the profile's platform:",
    "network": "use the profile's network: and allowed_networks:",
    "rootless": "sandboxes run as the job's user inside a root-started runsc",
    "host-uds": "slurmbox allows only socket creation for the srun broker",
    "nvproxy": "added when the step has NVIDIA GPUs",
    "tpuproxy": "added when the step has TPUs",
}
#: Vendors gVisor has no device proxy for (the weaker unproxied mode is needed).
UNPROXIED_VENDORS = ("amd", "trainium")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class SiteConfigError(ValueError):
    """The site configuration is invalid.

    ``details``: list of (key path, line or None, message); ``problems``: the
    same as "key.path (line N): message" strings; str() lists them all.
    """

    def __init__(self, source, problems):
        self.source = source
        self.details = [p if isinstance(p, tuple) else ("", None, p) for p in problems]
        self.problems = [_format_problem(p) for p in self.details]
        super().__init__("%s: invalid site configuration:\n  %s" % (source, "\n  ".join(self.problems)))

    def lines(self):
        """One "SOURCE:LINE: key.path: message" line per problem (compiler style)."""
        out = []
        for path, line, message in self.details:
            where = "%s:%d" % (self.source, line) if line else self.source
            out.append("%s: %s%s" % (where, "%s: " % path if path else "", message))
        return out


def _format_problem(detail):
    path, line, message = detail
    where = (path or "document") + (" (line %d)" % line if line else "")
    return "%s: %s" % (where, message)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _time_validator(unit):
    def check(cls, value):
        if value is None:
            return value
        slurm_syntax.time_seconds(value, unit)  # raises SyntaxProblem (a ValueError)
        return value
    return check


class ProfileModel(_Strict):
    """A sandbox profile (see slurmbox.settings.compiled.Profile)."""

    network: NetworkMode = "none"
    allowed_networks: List[NetworkMode] = ["none", "sandbox", "host"]
    allowed_mount_sources: List[str] = []
    allow_custom_image: bool = True
    platform: Literal["auto", "ptrace", "systrap", "kvm"] = "auto"
    runsc_flags: List[str] = []
    allow_unproxied_devices: bool = False
    memory_limit_mb: int = Field(0, ge=0)
    pids_limit: int = Field(0, ge=0)
    wall_limit: SlurmTime = 0

    _wall = field_validator("wall_limit")(_time_validator("minutes"))

    @field_validator("allowed_mount_sources")
    @classmethod
    def _absolute(cls, value):
        for path in value:
            if not path.startswith("/"):
                raise ValueError("mount source prefix %r must be an absolute path" % path)
        return value

    @field_validator("runsc_flags")
    @classmethod
    def _flags(cls, value):
        for flag in value:
            if not flag.startswith("--"):
                raise ValueError("runsc flag %r must start with --" % flag)
            name = flag[2:].split("=", 1)[0]
            if name in RESERVED_RUNSC_FLAGS:
                raise ValueError("runsc flag --%s is set by slurmbox itself: %s" % (name, RESERVED_RUNSC_FLAGS[name]))
        return value


class CheckpointModel(_Strict):
    """Checkpoint policy of a partition: ``mode`` transparent|signal|none,
    ``interval`` (minutes or a Slurm time; 0 = no periodic checkpoints),
    ``restore_fallback`` fresh|fail when no valid checkpoint image is left."""

    mode: Literal["transparent", "signal", "none"] = "transparent"
    interval: SlurmTime = 0
    restore_fallback: Literal["fresh", "fail"] = "fresh"

    _interval = field_validator("interval")(_time_validator("minutes"))


class PartitionModel(_Strict):
    """One Slurm partition: its node groups, preemption and sandbox policy."""

    nodes: List[str] = []
    default: bool = False
    spot: bool = False
    priority_tier: int = Field(1, ge=0, le=65533)
    preempt_mode: Optional[Literal["off", "cancel", "requeue", "suspend"]] = None
    grace_time: Optional[SlurmTime] = None
    max_time: SlurmTime = "INFINITE"
    sandbox: Literal["required", "optional", "forbidden"] = "optional"
    default_profile: str = "default"
    allowed_profiles: List[str] = []
    checkpoint: CheckpointModel = CheckpointModel()

    _grace = field_validator("grace_time")(_time_validator("seconds"))
    _max = field_validator("max_time")(_time_validator("minutes"))


class NodeGroupModel(_Strict):
    """Nodes of one kind: Slurm hostlist ``nodes``, optional ``node_addr``
    (one address per node, slurm.conf NodeAddr), accelerator ``vendor``,
    ``model`` (gres Type), ``count`` per node and ``devices`` (gres.conf File=,
    default per vendor), ``cpus``, optional ``sockets``/``cores_per_socket``/
    ``threads_per_core``, ``real_memory_mb`` (MB) and ``features``."""

    nodes: str
    node_addr: List[str] = []
    vendor: Optional[Vendor] = None
    model: Optional[str] = Field(None, pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    count: int = Field(0, ge=0, le=64)
    devices: Optional[str] = None
    cpus: int = Field(..., ge=1, le=65536)
    sockets: Optional[int] = Field(None, ge=1, le=64)
    cores_per_socket: Optional[int] = Field(None, ge=1, le=4096)
    threads_per_core: Optional[int] = Field(None, ge=1, le=16)
    real_memory_mb: int = Field(..., ge=1)
    features: List[str] = []

    @field_validator("nodes")
    @classmethod
    def _hostlist(cls, value):
        for name in slurm_syntax.expand_hostlist(value):
            if not re.match(_NAME, name):
                raise ValueError("node name %r: use letters, digits, '_', '.', '-'" % name)
        return value

    @field_validator("node_addr")
    @classmethod
    def _addresses(cls, value):
        for address in value:
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9.:_-]*$", address):
                raise ValueError("node address %r: expected an IP address or host name" % address)
        return value

    @field_validator("features")
    @classmethod
    def _features(cls, value):
        for feature in value:
            if not re.match(_NAME, feature):
                raise ValueError("feature %r: use letters, digits, '_', '.', '-'" % feature)
        return value

    def names(self):
        """Node names of this group, in hostlist order."""
        return slurm_syntax.expand_hostlist(self.nodes)

    def device_files(self):
        """gres.conf File= value (given, or the vendor default), or None without accelerators."""
        if not self.vendor or not self.count:
            return None
        return self.devices or DEFAULT_DEVICE_FILES[self.vendor](self.count)


class InstallModel(_Strict):
    """Where slurmbox is installed on the nodes (for the plugstack.conf line)."""

    prefix: str = "/opt/slurmbox"
    python: Optional[str] = None
    runtime_dir: str = "/run/slurmbox"
    site_config: str = "/etc/slurmbox/site.yaml"

    @field_validator("prefix", "python", "runtime_dir", "site_config")
    @classmethod
    def _absolute(cls, value):
        if value is not None and (not value.startswith("/") or any(c.isspace() for c in value)):
            raise ValueError("expected an absolute path without spaces")
        return value


class CgroupModel(_Strict):
    """cgroup.conf settings; device confinement (ConstrainDevices) is always on."""

    plugin: Literal["autodetect", "cgroup/v1", "cgroup/v2"] = "autodetect"
    ignore_systemd: bool = False
    constrain_cores: bool = True
    constrain_ram_space: bool = True


class CheckpointStoreModel(_Strict):
    """Checkpoint image store (see compiled.CheckpointStore)."""

    path: str = "/var/lib/slurmbox/checkpoints"
    keep_last: int = Field(2, ge=1, le=1000)
    compression: Literal["none", "flate-best-speed", "gzip", "zstd"] = "none"
    min_free_mb: int = Field(0, ge=0)
    cuda_checkpoint: Optional[str] = None
    allow_cuda_checkpoint: bool = False

    @field_validator("compression")
    @classmethod
    def _supported(cls, value):
        if value not in SUPPORTED_COMPRESSION:
            raise ValueError("compression %r is not supported yet: runsc writes the checkpoint image itself and "
                             "knows only none and flate-best-speed" % value)
        return value

    @field_validator("path", "cuda_checkpoint")
    @classmethod
    def _absolute(cls, value):
        if value is not None and not value.startswith("/"):
            raise ValueError("expected an absolute path")
        return value


class MeasurementModel(_Strict):
    """Measurement policy (see compiled.MeasurementPolicy)."""

    exclusive_gpus: bool = True
    clock_policy: Literal["default", "locked"] = "default"
    locked_sm_clock_mhz: int = Field(0, ge=0, le=10000)
    harness_cpus: str = ""
    sandbox_cpus: str = ""

    @field_validator("harness_cpus", "sandbox_cpus")
    @classmethod
    def _cpus(cls, value):
        slurm_syntax.parse_cpu_list(value)
        return value


class SiteModel(_Strict):
    """A whole site; see the module docstring and site-configs/."""

    cluster: str = Field(..., pattern=_NAME)
    slurmbox: InstallModel = InstallModel()
    cgroup: CgroupModel = CgroupModel()
    node_groups: Dict[str, NodeGroupModel] = {}
    partitions: Dict[str, PartitionModel] = {}
    profiles: Dict[str, ProfileModel] = {"default": ProfileModel()}
    checkpoint_store: CheckpointStoreModel = CheckpointStoreModel()
    measurement: MeasurementModel = MeasurementModel()

    def partition_nodes(self, name):
        """Node names of partition ``name`` (union of its node groups, in order)."""
        names = []
        for group in self.partitions[name].nodes:
            if group in self.node_groups:
                names.extend(self.node_groups[group].names())
        return names

    def required_partitions(self):
        """Names of partitions whose sandbox policy is required, sorted."""
        return sorted(n for n, p in self.partitions.items() if p.sandbox == "required")


# -- semantic checks: across fields, each with its key path ---------------------------

def _check_profiles(site):
    for name, profile in site.profiles.items():
        if profile.network not in profile.allowed_networks:
            yield (("profiles", name, "network"),
                   "network %r is not in allowed_networks %s" % (profile.network, profile.allowed_networks))
    for name, part in site.partitions.items():
        for key, profiles in (("default_profile", [part.default_profile]), ("allowed_profiles", part.allowed_profiles)):
            for profile in profiles:
                if profile not in site.profiles:
                    yield (("partitions", name, key),
                           "partition %r names profile %r, which is not defined under profiles (defined: %s)"
                           % (name, profile, ", ".join(sorted(site.profiles))))
        if part.allowed_profiles and part.default_profile not in part.allowed_profiles:
            yield (("partitions", name, "default_profile"),
                   "default profile %r is not in allowed_profiles %s" % (part.default_profile, part.allowed_profiles))


def _check_node_groups(site):
    owner = {}
    for name, group in site.node_groups.items():
        names = group.names()
        for node in names:
            if node in owner:
                yield (("node_groups", name, "nodes"),
                       "node %s is also in node group %r; a node belongs to exactly one group" % (node, owner[node]))
                break
            owner[node] = name
        if group.node_addr and len(group.node_addr) != len(names):
            yield (("node_groups", name, "node_addr"),
                   "%d addresses for %d nodes; give one address per node, in hostlist order"
                   % (len(group.node_addr), len(names)))
        accelerated = [k for k in ("vendor", "model", "devices") if getattr(group, k)] + (["count"] if group.count else [])
        if not accelerated:
            continue
        missing = [k for k in ("vendor", "model") if not getattr(group, k)] + ([] if group.count else ["count"])
        if missing:
            yield (("node_groups", name, missing[0]),
                   "a node group with accelerators needs vendor, model and count; %s missing" % ", ".join(missing))
            continue
        try:
            files = slurm_syntax.expand_hostlist(group.device_files())
        except SyntaxProblem as err:
            yield (("node_groups", name, "devices"), "not a device file list such as /dev/nvidia[0-7]: %s" % err)
            continue
        if len(files) != group.count:
            yield (("node_groups", name, "devices"),
                   "count is %d but devices %s lists %d device files; they must agree"
                   % (group.count, group.device_files(), len(files)))
        pattern = DEVICE_NAME_PATTERNS[group.vendor]
        for path in files:
            if not path.startswith("/") or not pattern.match(path.rsplit("/", 1)[-1]):
                yield (("node_groups", name, "devices"),
                       "%s is not a %s device file (expected names matching %s)"
                       % (path, group.vendor, pattern.pattern))
                break


def _partition_vendor_nodes(site, name):
    nodes, vendors = set(), set()
    for group in site.partitions[name].nodes:
        if group in site.node_groups:
            nodes.update(site.node_groups[group].names())
            if site.node_groups[group].count:
                vendors.add(site.node_groups[group].vendor)
    return nodes, vendors


def _check_partitions(site):
    defaults = [n for n, p in site.partitions.items() if p.default]
    if len(defaults) > 1:
        yield (("partitions", defaults[1], "default"),
               "partitions %s are all marked default; Slurm allows one default partition" % ", ".join(defaults))
    spans = {}
    for name, part in site.partitions.items():
        for index, group in enumerate(part.nodes):
            if group not in site.node_groups:
                yield (("partitions", name, "nodes", index),
                       "node group %r is not defined under node_groups (defined: %s)"
                       % (group, ", ".join(sorted(site.node_groups)) or "none"))
        spans[name] = _partition_vendor_nodes(site, name)
        if site.node_groups and not part.nodes:
            yield (("partitions", name, "nodes"), "a partition needs at least one node group")
        if part.spot:
            if part.preempt_mode is None or part.grace_time is None:
                yield (("partitions", name), "spot partition %r needs preemption settings: preempt_mode "
                       "(requeue or cancel) and grace_time (seconds the job gets between SIGTERM and the kill)"
                       % name)
            elif part.preempt_mode not in ("requeue", "cancel"):
                yield (("partitions", name, "preempt_mode"),
                       "a spot partition must free its nodes when preempted: use requeue or cancel, not %s"
                       % part.preempt_mode)
        vendors = spans[name][1]
        if part.sandbox != "forbidden" and vendors & set(UNPROXIED_VENDORS):
            for profile_name in [part.default_profile] + list(part.allowed_profiles):
                profile = site.profiles.get(profile_name)
                if profile is not None and not profile.allow_unproxied_devices:
                    yield (("partitions", name, "default_profile" if profile_name == part.default_profile
                            else "allowed_profiles"),
                           "partition %r has %s accelerators, which gVisor cannot proxy; profile %r must set "
                           "allow_unproxied_devices: true (or make the partition's sandbox forbidden)"
                           % (name, "/".join(sorted(vendors & set(UNPROXIED_VENDORS))), profile_name))
                    break
    names = sorted(site.partitions)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            shared = spans[first][0] & spans[second][0]
            a, b = site.partitions[first], site.partitions[second]
            if not shared or a.spot == b.spot:
                continue
            spot_name, spot, ondemand_name, ondemand = (first, a, second, b) if a.spot else (second, b, first, a)
            if ondemand.priority_tier <= spot.priority_tier:
                yield (("partitions", ondemand_name, "priority_tier"),
                       "partitions %r and %r overlap on %d nodes (e.g. %s) but on-demand %r has priority_tier %d, "
                       "not above spot %r's %d, so its jobs could never preempt spot jobs; raise it"
                       % (ondemand_name, spot_name, len(shared), sorted(shared)[0], ondemand_name,
                          ondemand.priority_tier, spot_name, spot.priority_tier))


def _check_measurement(site):
    m = site.measurement
    if m.clock_policy == "locked" and not m.locked_sm_clock_mhz:
        yield (("measurement", "locked_sm_clock_mhz"), "clock_policy locked needs locked_sm_clock_mhz (MHz)")
    if m.clock_policy == "default" and m.locked_sm_clock_mhz:
        yield (("measurement", "locked_sm_clock_mhz"), "set only with clock_policy: locked")
    both = set(slurm_syntax.parse_cpu_list(m.harness_cpus)) & set(slurm_syntax.parse_cpu_list(m.sandbox_cpus))
    if both:
        yield (("measurement", "sandbox_cpus"),
               "harness_cpus and sandbox_cpus share CPUs %s; they must be disjoint" % sorted(both)[:8])


def _check_names(site):
    for section in ("node_groups", "partitions", "profiles"):
        for name in getattr(site, section):
            if not re.match(_NAME, name):
                yield ((section, name), "name %r: use letters, digits, '_', '.', '-' (it becomes a Slurm or "
                       "--sandbox=PROFILE name)" % name)


SEMANTIC_CHECKS = (_check_names, _check_profiles, _check_node_groups, _check_partitions, _check_measurement)


# -- loading with key paths and line numbers ------------------------------------------

def _child(node, key):
    """The YAML node under ``key`` (str key or list index) of a composed node, or None."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == str(key):
                return key_node, value_node
    elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
        return node.value[key], node.value[key]
    return None


def _locate(root, path):
    """(path elements that exist in the document, line of the deepest one or None)."""
    found, line, node = [], None, root
    for element in path:
        hit = _child(node, element) if node is not None else None
        if hit is None:
            break
        key_node, node = hit
        found.append(element)
        line = key_node.start_mark.line + 1
    if not found and root is not None:
        line = root.start_mark.line + 1
    return found, line


def _field_names(path):
    """Allowed keys of the model reached by ``path`` from SiteModel, or None."""
    current = SiteModel
    for element in path:
        if isinstance(current, type) and issubclass(current, BaseModel):
            info = current.model_fields.get(element)
            if info is None:
                return None
            current = info.annotation
        elif typing.get_origin(current) in (dict, list):
            current = typing.get_args(current)[-1]
        else:
            return None
        while typing.get_origin(current) is Union:
            options = [a for a in typing.get_args(current) if a is not type(None)]
            current = options[0] if len(options) == 1 else None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return None


def _pydantic_problems(err, root):
    merged = {}
    for error in err.errors():
        loc = list(error["loc"])
        found, line = _locate(root, loc)
        if error["type"] == "missing":
            shown = loc
            message = "required key is missing"
        elif error["type"] == "extra_forbidden":
            shown = loc
            allowed = _field_names(loc[:-1])
            message = "unknown key" + ("; expected one of: %s" % ", ".join(allowed) if allowed else "")
        else:
            shown = found or loc[:1]
            message = error["msg"]
            if message.startswith("Value error, "):
                message = message[len("Value error, "):]
            if "input" in error and not isinstance(error["input"], (dict, list)) \
                    and repr(error["input"]) not in message:
                message += " (got %r)" % (error["input"],)
        key = (".".join(str(p) for p in shown), line)
        if key in merged and message not in merged[key]:
            merged[key].append(message)
        else:
            merged.setdefault(key, [message])
    out = []
    for (path, line), messages in merged.items():
        if len(messages) > 1 and any(m.startswith("Input should be a valid integer") for m in messages) \
                and any(m.startswith("Input should be a valid string") for m in messages):
            messages = ["expected a number or a Slurm time string such as 30, 1:30:00 or 2-00:00:00"]
        out.append((path, line, "; or ".join(messages)))
    return out


#: Most values a document may hold once YAML aliases are expanded (bounds alias "bombs").
MAX_EXPANDED_VALUES = 200000


def _expansion_problem(root):
    """A message when YAML aliases make the document recursive or expand it past
    MAX_EXPANDED_VALUES values, else None."""
    memo, active = {}, set()

    def size(node):
        key = id(node)
        if key in memo:
            return memo[key]
        if key in active:
            raise ValueError("a YAML alias refers to a node that contains it (recursive document)")
        active.add(key)
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(item) for item in node.value)
        else:
            total = 1
        active.discard(key)
        if total > MAX_EXPANDED_VALUES:
            raise ValueError("YAML aliases expand this document to more than %d values" % MAX_EXPANDED_VALUES)
        memo[key] = total
        return total

    try:
        size(root)
    except ValueError as err:
        return str(err)
    except RecursionError:
        return "document nested too deeply"
    return None


def _duplicate_keys(node, path=()):
    """(path, line, message) for mapping keys given twice (YAML keeps only the last silently)."""
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and key in seen:
                yield (".".join(path + (key,)), key_node.start_mark.line + 1, "key given twice; keep one")
            seen.add(key)
            yield from _duplicate_keys(value_node, path + (str(key),))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicate_keys(item, path + (str(index),))


class SiteLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 scalars: no base-60 numbers, so ``1:30:00`` stays a Slurm time
    string (PyYAML would read it as the integer 5400), and only true/false are booleans, so
    ``preempt_mode: off`` stays the word Slurm uses."""


SiteLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _first in "-+0123456789.":
    SiteLoader.yaml_implicit_resolvers.setdefault(_first, [])
SiteLoader.add_implicit_resolver(  # YAML 1.2 booleans only: "off"/"no" stay strings (preempt_mode: off)
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
SiteLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"))
SiteLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def load_site(text, source="<site config>"):
    """Parse and validate YAML ``text``. Returns SiteModel.

    Raises SiteConfigError listing every problem with its key path and line:
    not YAML, not a mapping, keys given twice, wrong types or values, unknown
    keys, and the cross-field rules (profiles and node groups that are not
    defined, overlapping node groups, accelerator counts that disagree with
    the device files, spot partitions without preemption settings or a
    higher-tier on-demand partition, vendors gVisor cannot proxy without the
    weaker mode). The cross-field rules run once every value has the right
    type, so a document with type errors lists those first.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise SiteConfigError(source, [("", None, "not UTF-8 text (byte %d); a site configuration is YAML"
                                            % err.start)])
    try:
        root = yaml.compose(text, Loader=SiteLoader)
        document = yaml.load(text, Loader=SiteLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SiteConfigError(source, [("", mark.line + 1 if mark else None, "not valid YAML: %s" % problem)])
    except (ValueError, RecursionError, OverflowError) as err:
        raise SiteConfigError(source, [("", None, "cannot read this document: %s" % err)])
    if not isinstance(document, dict):
        raise SiteConfigError(source, [("", root.start_mark.line + 1 if root is not None else None,
                                        "expected a mapping of settings (cluster:, node_groups:, partitions:, "
                                        "profiles: ...), got %s" % ("an empty document" if document is None
                                                                    else type(document).__name__))])
    expansion = _expansion_problem(root)
    if expansion:
        raise SiteConfigError(source, [("", None, expansion)])
    try:
        duplicates = list(_duplicate_keys(root))
    except RecursionError:
        raise SiteConfigError(source, [("", None, "document nested too deeply")])
    if duplicates:
        raise SiteConfigError(source, duplicates)
    try:
        site = SiteModel.model_validate(document)
    except ValidationError as err:
        raise SiteConfigError(source, _pydantic_problems(err, root))
    except RecursionError:
        raise SiteConfigError(source, [("", None, "document nested too deeply")])
    problems = []
    for check in SEMANTIC_CHECKS:
        for path, message in check(site):
            found, line = _locate(root, list(path))
            problems.append((".".join(str(p) for p in path), line, message))
    if problems:
        raise SiteConfigError(source, problems)
    return site


def load_site_file(path):
    """load_site of the file at ``path``; an unreadable file is a SiteConfigError too."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as err:
        raise SiteConfigError(path, [("", None, "cannot read the file: %s" % (err.strerror or err))])
    return load_site(raw, path)


def compile_site(site):
    """The slurmbox.settings.compiled.SitePolicy of a validated SiteModel."""
    from slurmbox.settings.compiled import (CheckpointStore, MeasurementPolicy, PartitionPolicy, Profile,
                                               SitePolicy)

    def profile(p):
        values = p.model_dump()
        wall = slurm_syntax.time_seconds(values.pop("wall_limit"), "minutes")
        values["wall_limit_s"] = 0 if wall == slurm_syntax.INFINITE else wall
        return Profile(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    def partition(name, p):
        interval = slurm_syntax.time_seconds(p.checkpoint.interval, "minutes")
        return PartitionPolicy(sandbox=p.sandbox, default_profile=p.default_profile,
                               allowed_profiles=tuple(p.allowed_profiles), preemptible=p.spot,
                               checkpoint_mode=p.checkpoint.mode,
                               checkpoint_interval_s=0 if interval == slurm_syntax.INFINITE else interval,
                               restore_fallback=p.checkpoint.restore_fallback,
                               accelerator_vendors=tuple(sorted(_partition_vendor_nodes(site, name)[1])))

    return SitePolicy(
        profiles={n: profile(p) for n, p in site.profiles.items()},
        partitions={n: partition(n, p) for n, p in site.partitions.items()},
        checkpoint_store=CheckpointStore(**site.checkpoint_store.model_dump()),
        measurement=MeasurementPolicy(**site.measurement.model_dump()),
    )


def compile_policy(text, source="<site config>"):
    """Validate YAML ``text`` and return its slurmbox.settings.compiled.SitePolicy.

    Raises SiteConfigError."""
    return compile_site(load_site(text, source))
