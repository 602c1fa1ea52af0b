"""Find the checkpoint store and runtime directory for admin and user commands.

The SPANK shim's ``plugstack.conf`` line (slurmbox.settings.plugstack)
names the site configuration and the runtime directory; the site
configuration names the checkpoint store. Command-line options override each.
"""

import os

from slurmbox.migrate.store import CheckpointStore, store_from_policy


class LocateError(RuntimeError):
    """The store or runtime directory cannot be found; the message says which option to pass."""


def shim_settings(slurm_conf=None):
    """slurmbox's plugstack settings (dict), or the shim's defaults when there is no slurmbox line."""
    from slurmbox.settings.plugstack import SHIM_DEFAULTS, PlugstackError, slurmbox_settings

    try:
        return slurmbox_settings(slurm_conf)
    except PlugstackError:
        return dict(SHIM_DEFAULTS)


def site_policy(site_config):
    """The compiled SitePolicy of the YAML file ``site_config``. Raises LocateError with the reason."""
    from slurmbox.settings.model import SiteConfigError, compile_policy

    try:
        with open(site_config) as handle:
            return compile_policy(handle.read(), site_config)
    except OSError as err:
        raise LocateError("cannot read the site configuration %s: %s" % (site_config, err.strerror))
    except SiteConfigError as err:
        raise LocateError(str(err))


def find_store(store=None, site_config=None, slurm_conf=None):
    """The CheckpointStore: ``store`` (a directory) if given, else the site configuration's
    (``site_config``, else plugstack's ``site_config=``), else the default location."""
    if store:
        return CheckpointStore(store)
    site_config = site_config or shim_settings(slurm_conf).get("site_config")
    if site_config and os.path.exists(site_config):
        return store_from_policy(site_policy(site_config))
    if site_config:
        raise LocateError("the site configuration %s does not exist; pass --site-config or --store" % site_config)
    return store_from_policy(object())


def find_runtime_dir(runtime_dir=None, slurm_conf=None):
    """slurmbox's runtime directory: ``runtime_dir`` if given, else plugstack's ``runtime_dir=``."""
    return runtime_dir or shim_settings(slurm_conf).get("runtime_dir") or "/run/slurmbox"
