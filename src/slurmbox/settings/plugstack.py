"""Write and find slurmbox's line in a node's ``plugstack.conf``.

Admin tools (``slurmbox sandbox``, ``slurmbox doctor``) must use the same
runtime directory and site configuration as the SPANK shim, and the shim's
single source of truth is its ``plugstack.conf`` line. Format, spank(8):
one plugin per line, ``required|optional PATH [ARGS...]``, ``#`` comments,
and ``include GLOB`` lines; the file is ``PlugStackConfig=`` of slurm.conf(5),
by default ``plugstack.conf`` in slurm.conf's directory.
"""

import glob
import os

#: Values the shim uses when plugstack.conf does not set them (spank_plugin/slurmbox_spank.c).
SHIM_DEFAULTS = {"runtime_dir": "/run/slurmbox", "site_config": "", "required_partitions": ""}
PLUGIN_NAME = "slurmbox_spank.so"


class PlugstackError(RuntimeError):
    """No slurmbox line was found, or a config file could not be read."""


def plugstack_path(slurm_conf):
    """The plugstack.conf path that ``slurm_conf`` (a slurm.conf path) configures."""
    default = os.path.join(os.path.dirname(slurm_conf), "plugstack.conf")
    try:
        with open(slurm_conf, errors="replace") as handle:  # Slurm reads bytes; only ASCII keys matter
            for line in handle:
                key, _, value = line.split("#", 1)[0].strip().partition("=")
                if key.strip().lower() == "plugstackconfig" and value.strip():
                    return value.strip()
    except OSError as err:
        raise PlugstackError("cannot read %s: %s" % (slurm_conf, err.strerror))
    return default


def _plugin_lines(path, depth=0):
    if depth > 4:
        return
    try:
        with open(path, errors="replace") as handle:
            lines = handle.readlines()
    except OSError:
        return
    for line in lines:
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] == "include" and len(words) > 1:
            base = os.path.dirname(path)
            for pattern in words[1:]:
                for included in sorted(glob.glob(os.path.join(base, pattern))):
                    yield from _plugin_lines(included, depth + 1)
        elif len(words) >= 2 and words[0] in ("required", "optional"):
            yield words


def slurmbox_settings(slurm_conf=None):
    """slurmbox's plugstack arguments for ``slurm_conf`` -> dict (shim defaults filled in).

    ``slurm_conf`` defaults to ``$SLURM_CONF`` or ``/etc/slurm/slurm.conf``.
    Raises PlugstackError when no line loads ``slurmbox_spank.so``.
    """
    slurm_conf = slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    path = plugstack_path(slurm_conf)
    for words in _plugin_lines(path):
        if os.path.basename(words[1]) == PLUGIN_NAME:
            settings = dict(SHIM_DEFAULTS, plugin=words[1], plugstack=path)
            for arg in words[2:]:
                key, sep, value = arg.partition("=")
                if sep:
                    settings[key] = value
            return settings
    raise PlugstackError("no line loading %s in %s (from %s); is slurmbox installed on this node? "
                         "See `slurmbox plugin install`." % (PLUGIN_NAME, path, slurm_conf))


def plugstack_line(plugin, python, launcher, runtime_dir, site_config=None, required_partitions=()):
    """The plugstack.conf line (spank(8): ``required PATH ARGS``) for the shim."""
    args = ["python=%s" % python, "launcher=%s" % launcher, "runtime_dir=%s" % runtime_dir]
    if site_config:
        args.append("site_config=%s" % site_config)
    if required_partitions:
        args.append("required_partitions=%s" % ",".join(required_partitions))
    return "required %s %s\n" % (plugin, " ".join(args))
