"""The site's measurement policy (``SitePolicy.measurement`` in the compiled site policy).

Fields (settings.compiled.MeasurementPolicy): ``exclusive_gpus`` (bool),
``clock_policy`` ("default" | "locked"), ``locked_sm_clock_mhz`` (int or
None), ``harness_cpus`` and ``sandbox_cpus`` (cpulist strings such as "0" or
"1-3", or lists of ints). Every field is read with a default so a site
without the section, or an older compiled policy, still works.
"""

import os

from slurmbox.measure import isolation

DEFAULT_SITE_CONFIG = "/etc/slurmbox/site.yaml"
DEFAULTS = {"exclusive_gpus": True, "clock_policy": "default", "locked_sm_clock_mhz": None,
            "harness_cpus": None, "sandbox_cpus": None}


def _cpus(value):
    if value in (None, "", [], ()):
        return None
    if isinstance(value, (list, tuple, set)):
        return set(int(v) for v in value)
    return isolation.parse_cpu_list(value)


def default_cpus():
    """(harness_cpus, sandbox_cpus) when the site names none: the first online CPU for the
    harness, the others for the sandbox (on a 1-CPU machine both share it)."""
    online = sorted(isolation.online_cpus())
    if len(online) < 2:
        return set(online), set(online)
    return {online[0]}, set(online[1:])


def load(site_config=None, cache_dir="/run/slurmbox"):
    """The measurement policy as a dict (keys of DEFAULTS; CPU fields as sets or None).

    ``site_config``: YAML path (default /etc/slurmbox/site.yaml when it
    exists). Raises OSError/ValueError from the site configuration loader
    when the file is unreadable or invalid.
    """
    path = site_config or (DEFAULT_SITE_CONFIG if os.path.exists(DEFAULT_SITE_CONFIG) else None)
    measurement = None
    if path:
        from slurmbox.settings.compiled import load_policy
        measurement = getattr(load_policy(path, cache_dir), "measurement", None)
    if isinstance(measurement, dict):
        raw = {k: measurement.get(k, v) for k, v in DEFAULTS.items()}
    else:
        raw = {k: getattr(measurement, k, v) for k, v in DEFAULTS.items()}
    raw["harness_cpus"] = _cpus(raw["harness_cpus"])
    raw["sandbox_cpus"] = _cpus(raw["sandbox_cpus"])
    return raw


def to_json(policy):
    """JSON-ready copy of a loaded policy (CPU sets as cpulist strings)."""
    return {k: (isolation.format_cpu_list(v) if isinstance(v, set) else v) for k, v in policy.items()}
