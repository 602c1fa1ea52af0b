"""Resolve and validate a step's --sandbox* options against the site policy.

The command line (passed by the SPANK shim) wins over the ``SLURMBOX_*``
environment fallbacks from the task environment. Everything here is untrusted
user input: it is checked against the site's sandbox profiles and partition
policy before anything runs. Standard library only (on the step start path).
"""

import os
from dataclasses import dataclass, field

NETWORK_MODES = ("none", "sandbox", "host")
#: Host trees never bound into a sandbox: kernel interfaces and device nodes
#: (devices come only from the allocation) and slurmbox's own runtime state.
FORBIDDEN_MOUNT_SOURCES = ("/proc", "/sys", "/dev", "/run/slurmbox")
#: Destinations inside the sandbox where slurmbox binds its own files (the batch script, the step broker,
#: the node's cuda-checkpoint: slurmbox.step.supervisor, step_broker, slurmbox.migrate.policy); no user
#: mount may be at or below them.
RESERVED_DESTINATIONS = ("/run/slurmbox-batch", "/run/slurmbox-broker", "/run/slurmbox-cuda-checkpoint")

#: option name (as the shim passes it) -> environment fallback variable.
ENV_FALLBACKS = {
    "sandbox": "SLURMBOX_SANDBOX",
    "image": "SLURMBOX_SANDBOX_IMAGE",
    "mounts": "SLURMBOX_SANDBOX_MOUNTS",
    "workdir": "SLURMBOX_SANDBOX_WORKDIR",
    "network": "SLURMBOX_SANDBOX_NETWORK",
    "dry-run": "SLURMBOX_SANDBOX_DRY_RUN",
}
#: option name -> the flag the user typed, for messages.
FLAG_NAMES = {
    "sandbox": "--sandbox", "no-sandbox": "--no-sandbox", "image": "--sandbox-image",
    "mounts": "--sandbox-mounts", "workdir": "--sandbox-workdir",
    "network": "--sandbox-network", "dry-run": "--sandbox-dry-run",
}
_TRUE_WORDS = ("", "1", "yes", "true", "on")


class OptionError(ValueError):
    """A sandbox option is invalid; ``str()`` names the option, the value and the fix."""

    def __init__(self, option, value, problem):
        self.option, self.value, self.problem = option, value, problem
        flag = FLAG_NAMES.get(option, option)
        super().__init__("%s: %s" % ("%s=%r" % (flag, value) if value else flag, problem))


@dataclass(frozen=True)
class Mount:
    """One bind mount: host ``source`` at sandbox ``destination``; ``read_only`` flag."""

    source: str
    destination: str
    read_only: bool


@dataclass
class SandboxRequest:
    """The validated sandbox settings of one step.

    ``profile``: profile name; ``image``: root file system directory, or None for
    the host root (read-only); ``mounts``: list of Mount; ``workdir``: working
    directory inside, or None for the task's cwd; ``network``: one of
    NETWORK_MODES; ``dry_run``: print the OCI spec instead of running;
    ``image_bind``: the supervisor's root-owned bind of ``image`` that runsc
    serves as the root (sandbox/user_paths.py), None until staged.
    """

    profile: str
    image: str = None
    mounts: list = field(default_factory=list)
    workdir: str = None
    network: str = "none"
    dry_run: bool = False
    image_bind: str = None


def merge_sources(cli_options, task_env):
    """Combine command-line options with environment fallbacks.

    ``cli_options``: dict option name -> value, as given on the command line;
    ``task_env``: the task's environment. Returns a dict of the same shape in
    which the command line wins.
    """
    merged = {}
    for name, var in ENV_FALLBACKS.items():
        if name in cli_options:
            merged[name] = cli_options[name]
        elif var in task_env:
            merged[name] = task_env[var]
        if merged.get(name) == "(null)":  # how sbatch passes a flag given without a value
            merged[name] = ""
    if "no-sandbox" in cli_options:
        merged["no-sandbox"] = ""
    return merged


def parse_mounts(text):
    """Parse ``SRC:DST[:ro|rw][,...]`` into a list of Mount (default mode: rw).

    Raises OptionError for empty entries, relative paths, ``..`` components,
    an unknown mode, a destination of ``/``, or one at or below RESERVED_DESTINATIONS.
    """
    mounts = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise OptionError("mounts", text, "empty mount entry; expected SRC:DST[:ro|rw]")
        parts = entry.split(":")
        if len(parts) not in (2, 3):
            raise OptionError("mounts", text, "entry %r is not SRC:DST[:ro|rw]" % entry)
        source, destination = parts[0], parts[1]
        mode = parts[2] if len(parts) == 3 else "rw"
        if mode not in ("ro", "rw"):
            raise OptionError("mounts", text, "mode %r of entry %r is not ro or rw" % (mode, entry))
        for path in (source, destination):
            if not path.startswith("/"):
                raise OptionError("mounts", text, "path %r of entry %r is not absolute" % (path, entry))
            if ".." in path.split("/"):
                raise OptionError("mounts", text, "path %r of entry %r contains '..'" % (path, entry))
        if os.path.normpath(destination) == "/":
            raise OptionError("mounts", text, "entry %r would replace the sandbox root" % entry)
        reserved = [r for r in RESERVED_DESTINATIONS if os.path.normpath(destination) == r
                    or os.path.normpath(destination).startswith(r + "/")]
        if reserved:
            raise OptionError("mounts", text, "destination %s of entry %r is reserved for slurmbox's own files; "
                              "choose another destination" % (reserved[0], entry))
        mounts.append(Mount(os.path.normpath(source), os.path.normpath(destination), mode == "ro"))
    return mounts


def source_problem(real_path, profile, runtime_dir=None):
    """Why the host directory or file at ``real_path`` may not be bound into a sandbox, or None.

    ``real_path``: the kernel's path of the inode the supervisor opened as the
    user (``/proc/self/fd/N``), so no symlink or rename can change what is
    judged; ``profile``: the step's compiled Profile (``allowed_mount_sources``);
    ``runtime_dir``: slurmbox's runtime directory. Refused: ``/``, the
    FORBIDDEN_MOUNT_SOURCES trees and the runtime directory, and anything outside
    the profile's allowed sources when it lists any.
    """
    forbidden = FORBIDDEN_MOUNT_SOURCES + ((os.path.realpath(runtime_dir),) if runtime_dir else ())
    if real_path == "/" or any(real_path == p or real_path.startswith(p + "/") for p in forbidden):
        return ("%s is a system directory or slurmbox's runtime directory, which cannot be mounted into a "
                "sandbox" % real_path)
    allowed = getattr(profile, "allowed_mount_sources", None) or ()
    if allowed and not any(real_path == prefix or real_path.startswith(prefix.rstrip("/") + "/")
                           for prefix in allowed):
        return "%s is outside the profile's allowed mount sources (%s)" % (real_path, ", ".join(allowed))
    return None


def resolve(options, policy, partition, partition_requires=False, runtime_dir=None):
    """Validate merged options (see merge_sources) against the site policy.

    ``policy``: a settings.compiled.SitePolicy; ``partition``: the job's
    partition name; ``runtime_dir``: unused here (source_problem judges mount
    sources once they are opened). Looks at no file: it runs as root, and
    what root finds must never answer a user's question. Returns a
    SandboxRequest. Raises OptionError naming the option and value for
    anything the user must fix.
    """
    part = policy.partition(partition)
    if "no-sandbox" in options:
        if partition_requires or part.sandbox == "required":
            raise OptionError("no-sandbox", "", "partition %r requires sandboxing; remove --no-sandbox "
                              "or submit to a partition whose sandbox policy is optional" % partition)
    if part.sandbox == "forbidden":
        raise OptionError("sandbox", options.get("sandbox", ""),
                          "partition %r does not allow sandboxed steps; use another partition" % partition)
    requested = options.get("sandbox", "")
    profile_name = part.default_profile if requested.lower() in _TRUE_WORDS else requested
    if profile_name not in policy.profiles:
        raise OptionError("sandbox", requested, "unknown profile; defined profiles: %s"
                          % ", ".join(sorted(policy.profiles)))
    if part.allowed_profiles and profile_name not in part.allowed_profiles:
        raise OptionError("sandbox", requested, "profile not allowed on partition %r; allowed: %s"
                          % (partition, ", ".join(part.allowed_profiles)))
    profile = policy.profiles[profile_name]
    request = SandboxRequest(profile=profile_name, network=profile.network)

    if "network" in options:
        mode = options["network"]
        if mode not in NETWORK_MODES:
            raise OptionError("network", mode, "expected one of %s" % "|".join(NETWORK_MODES))
        if mode not in profile.allowed_networks:
            raise OptionError("network", mode, "profile %r allows only %s"
                              % (profile_name, ", ".join(profile.allowed_networks)))
        request.network = mode
    if options.get("image"):
        image = options["image"]
        if not profile.allow_custom_image:
            raise OptionError("image", image, "profile %r does not allow custom images" % profile_name)
        if not image.startswith("/") or ".." in image.split("/"):
            raise OptionError("image", image, "expected the absolute path of a root file system directory, "
                              "without '..'")
        request.image = os.path.normpath(image)
    if options.get("mounts"):
        # Syntax only: the sources are judged by source_problem on what the supervisor opens
        # as the user (sandbox/user_paths.py), never on a path root looked at before.
        request.mounts = parse_mounts(options["mounts"])
    if options.get("workdir"):
        workdir = options["workdir"]
        if not workdir.startswith("/") or ".." in workdir.split("/"):
            raise OptionError("workdir", workdir, "expected an absolute path without '..'")
        request.workdir = os.path.normpath(workdir)
    if "dry-run" in options:
        request.dry_run = options["dry-run"].lower() in _TRUE_WORDS
    return request
