"""The admin-written override file (YAML, validated with pydantic), applied after every
discovered source::

    guid_hosts:                 # HCA node/port GUID -> host, for NodeDescriptions naming none
      "0x0008f10403960558": gpu001
    nvlink_domains:             # multi-node NVLink domains the fabric info does not give
      - name: rack1
        cluster_uuid: 5b0e4d52-1c5a-4c0e-9d7e-3b1f6e0a2c11   # optional
        clique_id: 1                                          # optional
        hosts: gpu[001-018]
    exclude_hosts: login[1-2]   # hosts never written to Slurm files nor placed on
    switch_names:               # fixed Slurm names for switches (ident -> name)
      S-e41d2d030003e470: core1

Unknown keys are an error.
"""

from typing import Dict, List, Optional

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .hostlists import expand
from .model import TopologyError


class DomainOverride(BaseModel):
    """One NVLink domain: ``name``, optional ``cluster_uuid``/``clique_id``, ``hosts`` (hostlist)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    cluster_uuid: Optional[str] = None
    clique_id: Optional[int] = None
    hosts: str


class Override(BaseModel):
    """The whole override file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    guid_hosts: Dict[str, str] = {}
    nvlink_domains: List[DomainOverride] = []
    exclude_hosts: str = ""
    switch_names: Dict[str, str] = {}

    @field_validator("guid_hosts")
    @classmethod
    def _guids(cls, value):
        for guid in value:
            int(guid, 16)
        return value


def parse(text, name="override"):
    """Override file text -> Override; TopologyError naming the bad key otherwise."""
    try:
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise TopologyError("%s: an override file is a YAML mapping with the keys %s" % (
                name, ", ".join(Override.model_fields)))
        return Override.model_validate(data)
    except yaml.YAMLError as err:
        raise TopologyError("%s: not YAML: %s" % (name, err))
    except ValidationError as err:
        problems = "; ".join("%s: %s" % (".".join(str(p) for p in e["loc"]), e["msg"]) for e in err.errors())
        raise TopologyError("%s: %s" % (name, problems))


def apply(topo, override):
    """Apply ``override`` to ``topo`` in place."""
    mapping = {int(g, 16): h for g, h in override.guid_hosts.items()}
    topo.guid_maps.update(mapping)
    for fabric in topo.fabrics:
        fabric.map_guids(mapping)
        for ident, new in override.switch_names.items():
            node = fabric.nodes.get(ident)
            if node is not None and node.kind == "switch":
                node.description = new
                node.guid = None if ident.startswith("S-") else node.guid
    for domain in override.nvlink_domains:
        for host in expand(domain.hosts):
            topo.add_domain_host(host, domain.cluster_uuid, domain.clique_id, domain.name)
    excluded = set(expand(override.exclude_hosts))
    if excluded:
        for fabric in topo.fabrics:
            for node in fabric.nodes.values():
                if node.kind == "ca" and node.host in excluded:
                    node.host = None
        for domain in topo.domains.values():
            domain.hosts -= excluded
        for host in excluded:
            topo.nodes.pop(host, None)
    return topo
