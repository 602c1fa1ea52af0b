"""Local HCAs from ``ibstat`` or ``ibv_devinfo`` text into :class:`Nic` objects.

``ibstat`` (infiniband-diags, ibstat(8)) prints ``CA 'mlx5_0'`` then indented
``Key: value`` lines, with ``Port N:`` sub-blocks (State, Rate, Base lid, SM lid,
Port GUID, Link layer). ``ibv_devinfo`` (ibverbs-utils, ibv_devinfo(1)) prints
``hca_id:\tmlx5_0`` then ``key:\tvalue`` lines with ``port:\tN`` sub-blocks (state
``PORT_ACTIVE (4)``, ``port_lid``, ``sm_lid``, ``link_layer``) and GUIDs as
``506b:4b03:00f9:f8ea``. Lines that fit neither (a stray GUID pair after the last CA)
are ignored.
"""

import re

from .model import Nic, NicPort, TopologyError

_IBSTAT_CA = re.compile(r"^CA '([^']+)'")
_DEVINFO_CA = re.compile(r"^hca_id:\s*(\S+)")


def _int(text, base=10):
    try:
        return int(text.split()[0], base)
    except (ValueError, IndexError):
        return None


def _guid(text):
    text = text.strip().split()[0] if text.strip() else ""
    if ":" in text:
        text = text.replace(":", "")
    try:
        return int(text, 16)
    except ValueError:
        return None


def parse_ibstat(text):
    """``ibstat`` text -> list of Nic (ports with state, rate, LIDs, GUID, link layer).

    Raises TopologyError when no ``CA '...'`` block is present.
    """
    nics, nic, port = [], None, None
    for raw in text.splitlines():
        match = _IBSTAT_CA.match(raw)
        if match:
            nic, port = Nic(match.group(1)), None
            nics.append(nic)
            continue
        if nic is None or ":" not in raw:
            continue
        key, _, value = raw.strip().partition(":")
        value = value.strip()
        if key.startswith("Port ") and value == "":
            port = NicPort(_int(key[5:]))
            nic.ports.append(port)
        elif port is None:
            if key == "CA type":
                nic.ca_type = value
            elif key == "Node GUID":
                nic.node_guid = _guid(value)
        elif key == "State":
            port.state = value
        elif key == "Rate":
            port.rate_gbps = float(value) if value.replace(".", "", 1).isdigit() else None
        elif key == "Base lid":
            port.lid = _int(value)
        elif key == "SM lid":
            port.sm_lid = _int(value)
        elif key == "Port GUID":
            port.port_guid = _guid(value)
        elif key == "Link layer":
            port.link_layer = value
    if not nics:
        raise TopologyError("no \"CA '<name>'\" block found; is this ibstat output?")
    return nics


_STATE = {"PORT_ACTIVE": "Active", "PORT_DOWN": "Down", "PORT_INIT": "Initializing", "PORT_ARMED": "Armed",
          "PORT_ACTIVE_DEFER": "Active"}


def parse_ibv_devinfo(text):
    """``ibv_devinfo`` text -> list of Nic; TopologyError when no ``hca_id:`` line is present."""
    nics, nic, port = [], None, None
    for raw in text.splitlines():
        match = _DEVINFO_CA.match(raw)
        if match:
            nic, port = Nic(match.group(1)), None
            nics.append(nic)
            continue
        if nic is None or ":" not in raw:
            continue
        key, _, value = raw.strip().partition(":")
        value = value.strip()
        if key == "port":
            port = NicPort(_int(value))
            nic.ports.append(port)
        elif key == "node_guid":
            nic.node_guid = _guid(value)
        elif key == "vendor_part_id":
            nic.ca_type = "MT" + value if value.isdigit() else value
        elif port is not None:
            if key == "state":
                port.state = _STATE.get(value.split()[0], value.split()[0])
            elif key == "port_lid":
                port.lid = _int(value)
            elif key == "sm_lid":
                port.sm_lid = _int(value)
            elif key == "link_layer":
                port.link_layer = value
    if not nics:
        raise TopologyError("no \"hca_id:\" line found; is this ibv_devinfo output?")
    return nics


def parse(text):
    """ibstat or ibv_devinfo text (detected) -> list of Nic."""
    if _DEVINFO_CA.search(text.lstrip()) and not _IBSTAT_CA.search(text):
        return parse_ibv_devinfo(text)
    return parse_ibstat(text)


def guid_map(nics, host):
    """{node or port GUID (int): ``host``} for every HCA in ``nics`` (for Fabric.map_guids)."""
    found = {}
    for nic in nics:
        if nic.node_guid is not None:
            found[nic.node_guid] = host
        for port in nic.ports:
            if port.port_guid is not None:
                found[port.port_guid] = host
    return found


def subnets(nics):
    """{SM lid: [nic names]} over InfiniBand ports with a subnet manager: ports reporting
    different SM LIDs are on different IB subnets (rails)."""
    found = {}
    for nic in nics:
        for port in nic.ports:
            if port.link_layer == "InfiniBand" and port.sm_lid:
                found.setdefault(port.sm_lid, []).append(nic.name)
    return dict(sorted(found.items()))
