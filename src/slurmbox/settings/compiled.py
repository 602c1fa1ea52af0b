"""The compiled site policy read on every sandboxed step's start path.

The admin-written site configuration (YAML, see ``slurmbox.settings.model``)
is validated with pydantic once and cached as JSON next to the step runtime
directory; this module reads that JSON with the standard library only, so the
supervisor never pays pydantic's import cost. A stale or missing cache is
rebuilt through the model (slow path, once per change of the source file).
"""

import hashlib
import json
import os
from dataclasses import dataclass, field

COMPILED_FORMAT = 3


@dataclass(frozen=True)
class Profile:
    """A sandbox profile: default ``network`` mode, ``allowed_networks``,
    ``allowed_mount_sources`` (host path prefixes; empty = any the user can
    reach), ``allow_custom_image``, runsc ``platform`` ("auto": systrap where
    available, else ptrace) and extra ``runsc_flags``.

    Limits (0 = none), applied by the supervisor: ``memory_limit_mb`` (MB, the
    cgroup of the whole sandbox: gVisor's kernel and the tasks; over it the
    sandbox is killed), ``pids_limit`` (host threads and processes of the
    sandbox: the sentry's and the platform's, about three per task with
    ptrace, not the tasks inside; over it the sandbox fails) and
    ``wall_limit_s`` (seconds from the step's first task; then the sandbox is
    killed with a message on the task's stderr)."""

    network: str = "none"
    allowed_networks: tuple = ("none", "sandbox", "host")
    allowed_mount_sources: tuple = ()
    allow_custom_image: bool = True
    platform: str = "auto"
    runsc_flags: tuple = ()
    allow_unproxied_devices: bool = False
    memory_limit_mb: int = 0
    pids_limit: int = 0
    wall_limit_s: int = 0


@dataclass(frozen=True)
class PartitionPolicy:
    """Policy of one partition.

    ``sandbox``: required|optional|forbidden; ``default_profile`` and
    ``allowed_profiles`` (empty = any defined profile); ``preemptible``: a
    spot partition whose jobs Slurm may preempt (requeue); ``checkpoint_mode``:
    transparent (slurmbox checkpoints the sandbox with runsc) | signal (the
    job checkpoints itself on a signal) | none; ``checkpoint_interval_s``:
    seconds between periodic checkpoints, 0 = none; ``restore_fallback``:
    fresh (start the job from scratch) | fail, when no valid checkpoint image
    is left; ``accelerator_vendors``: sorted vendors ("nvidia", "amd", "tpu",
    "trainium") of the accelerators in the partition's node groups (empty =
    none or not described).
    """

    sandbox: str = "optional"
    default_profile: str = "default"
    allowed_profiles: tuple = ()
    preemptible: bool = False
    checkpoint_mode: str = "transparent"
    checkpoint_interval_s: int = 0
    restore_fallback: str = "fresh"
    accelerator_vendors: tuple = ()


@dataclass(frozen=True)
class CheckpointStore:
    """Where checkpoint images live: ``path`` (a directory every node sees),
    ``keep_last`` images kept per job, ``compression`` none|flate-best-speed of the
    stored image, ``min_free_mb`` (MB) that must stay free before a new
    checkpoint is written (0 = no floor), and ``cuda_checkpoint``: the path on
    the nodes of NVIDIA's cuda-checkpoint (root's), bound read-only into GPU
    sandboxes, where runsc runs it to save CUDA state (None = looked for in
    slurmbox.migrate.policy.CUDA_CHECKPOINT_PATHS), and ``allow_cuda_checkpoint``:
    whether runsc may (it runs as the sandbox's root inside the sandbox;
    slurmbox.migrate.policy.cuda_checkpoint_blockers; default no)."""

    path: str = "/var/lib/slurmbox/checkpoints"
    keep_last: int = 2
    compression: str = "none"
    min_free_mb: int = 0
    cuda_checkpoint: str = None
    allow_cuda_checkpoint: bool = False


@dataclass(frozen=True)
class MeasurementPolicy:
    """How benchmark steps measure kernels: ``exclusive_gpus`` (a measuring
    step must hold its GPUs alone), ``clock_policy`` default|locked with
    ``locked_sm_clock_mhz`` (MHz, 0 = the GPU's default application clock),
    and cpuset strings (``"0-3"``, cpuset(7) list format) pinning the
    measuring harness and the sandbox apart (empty = no pinning)."""

    exclusive_gpus: bool = True
    clock_policy: str = "default"
    locked_sm_clock_mhz: int = 0
    harness_cpus: str = ""
    sandbox_cpus: str = ""


@dataclass
class SitePolicy:
    """Profiles by name, partition policies by partition name, the
    checkpoint store and the measurement policy."""

    profiles: dict = field(default_factory=lambda: {"default": Profile()})
    partitions: dict = field(default_factory=dict)
    checkpoint_store: CheckpointStore = field(default_factory=CheckpointStore)
    measurement: MeasurementPolicy = field(default_factory=MeasurementPolicy)

    def partition(self, name):
        """Policy of partition ``name``; partitions not listed are optional/default."""
        return self.partitions.get(name, PartitionPolicy())

    def to_json(self):
        """JSON-ready dict of this policy (the compiled form)."""
        def tuples_to_lists(obj):
            return {k: list(v) if isinstance(v, tuple) else v for k, v in obj.__dict__.items()}
        return {
            "format": COMPILED_FORMAT,
            "profiles": {n: tuples_to_lists(p) for n, p in sorted(self.profiles.items())},
            "partitions": {n: tuples_to_lists(p) for n, p in sorted(self.partitions.items())},
            "checkpoint_store": tuples_to_lists(self.checkpoint_store),
            "measurement": tuples_to_lists(self.measurement),
        }

    @classmethod
    def from_json(cls, data):
        """Build from the dict produced by to_json. Raises KeyError/TypeError if malformed."""
        def lists_to_tuples(d):
            return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(
            profiles={n: Profile(**lists_to_tuples(p)) for n, p in data["profiles"].items()},
            partitions={n: PartitionPolicy(**lists_to_tuples(p)) for n, p in data["partitions"].items()},
            checkpoint_store=CheckpointStore(**data.get("checkpoint_store", {})),
            measurement=MeasurementPolicy(**data.get("measurement", {})),
        )


def cache_path(source_path, cache_dir):
    """Where the compiled JSON of ``source_path`` lives inside ``cache_dir``."""
    digest = hashlib.sha256(os.path.abspath(source_path).encode()).hexdigest()[:16]
    return os.path.join(cache_dir, "site-policy-%s.json" % digest)


def load_policy(source_path, cache_dir):
    """The SitePolicy of the site configuration at ``source_path``.

    ``source_path`` None or empty gives the built-in default policy. The cache
    in ``cache_dir`` is used when its recorded sha256 matches the source bytes;
    otherwise the source is validated with the pydantic model and the cache is
    rewritten atomically. Raises OSError if the source cannot be read and
    slurmbox.settings.model.SiteConfigError if it is invalid.
    """
    if not source_path:
        return SitePolicy()
    with open(source_path, "rb") as source:
        raw = source.read()
    digest = hashlib.sha256(raw).hexdigest()
    cached = cache_path(source_path, cache_dir)
    try:
        with open(cached) as handle:
            data = json.load(handle)
        if data.get("source_sha256") == digest and data.get("format") == COMPILED_FORMAT:
            return SitePolicy.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from slurmbox.settings.model import compile_policy  # slow path: pydantic
    policy = compile_policy(raw, source_path)  # bytes: a non-UTF-8 file is a SiteConfigError too
    write_cache(policy, digest, cached)
    return policy


def write_cache(policy, source_digest, cached):
    """Atomically write the compiled ``policy`` for a source with ``source_digest``."""
    data = policy.to_json()
    data["source_sha256"] = source_digest
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    tmp = "%s.tmp.%d" % (cached, os.getpid())
    with open(tmp, "w") as handle:
        json.dump(data, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, cached)
