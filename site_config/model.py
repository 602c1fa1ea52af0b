"""The admin-written site configuration (YAML), validated with pydantic.

Minimal schema for sandbox policy (the part the step start path needs)::

    cluster: demo
    profiles:
      default: {network: none, allowed_networks: [none, sandbox]}
    partitions:
      secure: {sandbox: required, default_profile: default}

Unknown keys are errors. ``compile_policy`` turns a document into the
standard-library ``SitePolicy`` that ``slurmbox.site_config.compiled`` caches.
"""

from typing import Dict, List, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

NetworkMode = Literal["none", "sandbox", "host"]


class SiteConfigError(ValueError):
    """The site configuration is invalid; ``problems`` is a list of "where: what" strings."""

    def __init__(self, source, problems):
        self.problems = problems
        super().__init__("%s: invalid site configuration:\n  %s" % (source, "\n  ".join(problems)))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProfileModel(_Strict):
    """A sandbox profile (see slurmbox.site_config.compiled.Profile)."""

    network: NetworkMode = "none"
    allowed_networks: List[NetworkMode] = ["none", "sandbox", "host"]
    allowed_mount_sources: List[str] = []
    allow_custom_image: bool = True
    platform: Literal["auto", "ptrace", "systrap", "kvm"] = "auto"
    runsc_flags: List[str] = []
    allow_unproxied_devices: bool = False

    @model_validator(mode="after")
    def _default_network_allowed(self):
        if self.network not in self.allowed_networks:
            raise ValueError("network %r is not in allowed_networks %s" % (self.network, self.allowed_networks))
        return self


class PartitionModel(_Strict):
    """Sandbox policy of one Slurm partition."""

    sandbox: Literal["required", "optional", "forbidden"] = "optional"
    default_profile: str = "default"
    allowed_profiles: List[str] = []


class SiteModel(_Strict):
    """A site: cluster name, sandbox profiles and partition policies."""

    cluster: str
    profiles: Dict[str, ProfileModel] = {"default": ProfileModel()}
    partitions: Dict[str, PartitionModel] = {}

    @model_validator(mode="after")
    def _profiles_defined(self):
        for name, part in self.partitions.items():
            for profile in [part.default_profile] + list(part.allowed_profiles):
                if profile not in self.profiles:
                    raise ValueError("partition %r names profile %r, which is not defined under profiles"
                                     % (name, profile))
        return self


def load_site(text, source="<site config>"):
    """Parse and validate YAML ``text``. Returns SiteModel; raises SiteConfigError."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = "line %d" % (mark.line + 1) if mark else "document"
        raise SiteConfigError(source, ["%s: not valid YAML (%s)" % (where, getattr(err, "problem", err))])
    if not isinstance(document, dict):
        raise SiteConfigError(source, ["document: expected a mapping of settings, got %s"
                                       % type(document).__name__])
    try:
        return SiteModel.model_validate(document)
    except ValidationError as err:
        problems = ["%s: %s" % (".".join(str(p) for p in e["loc"]) or "document", e["msg"]) for e in err.errors()]
        raise SiteConfigError(source, problems)


def compile_policy(text, source="<site config>"):
    """Validate YAML ``text`` and return its slurmbox.site_config.compiled.SitePolicy."""
    from slurmbox.site_config.compiled import PartitionPolicy, Profile, SitePolicy

    site = load_site(text, source)
    return SitePolicy(
        profiles={n: Profile(**{k: tuple(v) if isinstance(v, list) else v for k, v in p.model_dump().items()})
                  for n, p in site.profiles.items()},
        partitions={n: PartitionPolicy(**{k: tuple(v) if isinstance(v, list) else v
                                           for k, v in p.model_dump().items()})
                    for n, p in site.partitions.items()},
    )
