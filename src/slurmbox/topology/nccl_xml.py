"""NCCL's XML topology format (``NCCL_TOPO_FILE``, and ``NCCL_TOPO_DUMP_FILE`` output):
read it into a :class:`NodeTopology` and write one from the model.

Format (NCCL ``src/graph/xml.cc``/``xml.h``; RCCL's fork uses the same elements)::

    <system version="1">                      NCCL requires 1; RCCL dumps 2
      <cpu numaid="0" affinity="..." arch="x86_64" vendor="GenuineIntel" ...>
        <pci busid="0000:05:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
          <pci busid="0000:0c:00.0" class="0x030200" ...>          a GPU (class 0x03xxxx;
            <gpu dev="0" ...><nvlink target="<busid>" count="12" tclass="0x068000"/></gpu>
          </pci>                                                   AMD: 0x120000, <xgmi/>)
          <pci busid="0000:07:00.0" class="0x020700">              a NIC (class 0x02xxxx)
            <nic><net name="mlx5_0" dev="0" speed="400000" port="1" guid="0x..."/></nic>
          </pci>
        </pci>
      </cpu>
    </system>

GPU<->NIC levels follow the PCI tree: the same parent bridge is ``PIX``, a deeper common
bridge ``PXB``, only the CPU in common ``PHB`` (NCCL's name for a path through the CPU),
different CPUs ``SYS``. Inside gVisor ``/sys/bus/pci`` is not visible, so the written file
carries every attribute NCCL would otherwise read from sysfs (class, link speed/width).
"""

import xml.etree.ElementTree as ET

from .model import Gpu, Nic, NicPort, NodeTopology, PciNode, TopologyError

NVSWITCH_CLASS = "0x068000"
BRIDGE_CLASS = "0x060400"
DEFAULT_LINK = {"link_speed": "16.0 GT/s PCIe", "link_width": "16"}


def _is_gpu_class(klass):
    return klass.startswith("0x03") or klass.startswith("0x12")


def _is_nic_class(klass):
    return klass.startswith("0x02")


def parse(text, host=None):
    """NCCL/RCCL topology XML ``text`` -> NodeTopology (gpus, nics with bus ids, gpu_links
    from nvlink/xgmi elements, gpu_nic levels from the PCI tree, pci_roots kept for
    rewriting). Raises TopologyError on malformed XML or a root other than ``<system>``."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        raise TopologyError("not valid XML: %s" % err)
    if root.tag != "system":
        raise TopologyError("root element is <%s>, expected <system> (NCCL topology XML)" % root.tag)
    node = NodeTopology(host)
    node.xml_version = root.get("version")
    paths = {}  # device -> list of ancestors (cpu numaid first, then pci busids)
    gpu_links = []
    nvswitch_links = {}

    def walk(elem, numa, ancestors, parent_list):
        for child in elem:
            if child.tag != "pci":
                continue
            busid = child.get("busid", "").lower()
            klass = child.get("class", "")
            pci = PciNode(busid, klass, child.attrib)
            parent_list.append(pci)
            gpu_elem = child.find("gpu")
            nic_elem = child.find("nic")
            if _is_gpu_class(klass) or gpu_elem is not None:
                dev = gpu_elem.get("dev") if gpu_elem is not None else None
                index = int(dev) if dev is not None else len(node.gpus)
                gpu = Gpu(index, "GPU%d" % index, busid=busid, numa=numa,
                          vendor="amd" if klass.startswith("0x12") or child.get("vendor") == "0x1002" else "nvidia")
                node.gpus.append(gpu)
                pci.device, pci.extra = gpu, gpu_elem
                paths[gpu.name] = ancestors + [busid]
                if gpu_elem is not None:
                    for link in gpu_elem:
                        target = link.get("target", "").lower()
                        count = int(link.get("count", "1"))
                        if link.tag == "xgmi":
                            gpu_links.append((busid, target, "XGMI"))
                        elif link.tag == "nvlink":
                            if link.get("tclass") == NVSWITCH_CLASS:
                                nvswitch_links[busid] = count
                            else:
                                gpu_links.append((busid, target, "NV%d" % count))
            elif _is_nic_class(klass) or nic_elem is not None:
                nets = nic_elem.findall("net") if nic_elem is not None else []
                for net in nets or [None]:
                    name = net.get("name") if net is not None and net.get("name") else "NIC%d" % len(node.nics)
                    guid = net.get("guid") if net is not None else None
                    nic = Nic(name, busid=busid, node_guid=int(guid, 16) if guid else None, numa=numa,
                              ports=[NicPort(int(net.get("port", "1")))] if net is not None else [],
                              speed_mbps=int(net.get("speed")) if net is not None and net.get("speed") else None)
                    node.nics.append(nic)
                    paths[nic.name] = ancestors + [busid]
                pci.device, pci.extra = (node.nics[-1] if node.nics else None), nic_elem
            else:
                walk(child, numa, ancestors + [busid], pci.children)

    for cpu in root.findall("cpu"):
        numa = int(cpu.get("numaid", "0"))
        node.cpus.append((numa, cpu.get("affinity"), dict(cpu.attrib)))
        roots = node.pci_roots.setdefault(numa, [])
        walk(cpu, numa, ["cpu%d" % numa], roots)
    if not node.gpus and not node.nics:
        raise TopologyError("no GPU or NIC <pci> element found in the topology XML")
    by_bus = {g.busid: g.name for g in node.gpus}
    for a, b, level in gpu_links:
        if a in by_bus and b in by_bus:
            node.set_link(by_bus[a], by_bus[b], level)
    switched = sorted(nvswitch_links)
    for i, a in enumerate(switched):
        for b in switched[i + 1:]:
            node.set_link(by_bus[a], by_bus[b], "NV%d" % min(nvswitch_links[a], nvswitch_links[b]))
    for gpu in node.gpus:
        for nic in node.nics:
            node.gpu_nic[(gpu.name, nic.name)] = _level(paths[gpu.name], paths[nic.name])
    return node


def _level(a, b):
    """PCI path level between two devices given their ancestor lists (cpu first)."""
    if a[0] != b[0]:
        return "SYS"
    common = 0
    for x, y in zip(a[:-1], b[:-1]):
        if x != y:
            break
        common += 1
    if common <= 1:
        return "PHB"
    # Both hang directly under the same bridge: one bridge crossed.
    if common == len(a) - 1 and common == len(b) - 1:
        return "PIX"
    return "PXB"


def read(path, host=None):
    """Parse the topology XML in file ``path``."""
    try:
        with open(path, encoding="utf-8") as handle:
            return parse(handle.read(), host)
    except OSError as err:
        raise TopologyError("cannot read %s: %s" % (path, err.strerror))


# -- writing ------------------------------------------------------------------------
def _pci_elem(parent, attrs):
    elem = ET.SubElement(parent, "pci")
    for key in ("busid", "class", "vendor", "device", "subsystem_vendor", "subsystem_device",
                "link_speed", "link_width"):
        if attrs.get(key) is not None:
            elem.set(key, attrs[key])
    return elem


def _device_children(elem, pci, node):
    device = pci.device
    if isinstance(device, Gpu):
        if pci.extra is not None:
            elem.append(pci.extra)
        else:
            _gpu_links_elem(elem, device, node)
    elif isinstance(device, Nic):
        if pci.extra is not None:
            elem.append(pci.extra)
        else:
            _nic_elem(elem, [n for n in node.nics if n.busid == device.busid])


def _gpu_links_elem(elem, gpu, node):
    links = []
    for other in node.gpus:
        if other is gpu:
            continue
        level = node.link(gpu.name, other.name)
        if level and level.startswith("NV") and other.busid:
            links.append(("nvlink", other.busid, level[2:], "0x030200"))
        elif level == "XGMI" and other.busid:
            links.append(("xgmi", other.busid, "1", "0x120000"))
    if not links:
        return
    gelem = ET.SubElement(elem, "gpu", {"dev": str(gpu.index)})
    for tag, target, count, tclass in links:
        ET.SubElement(gelem, tag, {"target": target, "count": count, "tclass": tclass})


def _nic_elem(elem, nics):
    nic_elem = ET.SubElement(elem, "nic")
    for nic in nics:
        attrs = {"name": nic.name, "port": str(nic.ports[0].number if nic.ports else 1)}
        if nic.speed_mbps:
            attrs["speed"] = str(nic.speed_mbps)
        if nic.node_guid is not None:
            attrs["guid"] = "0x%x" % nic.node_guid
        ET.SubElement(nic_elem, "net", attrs)


def _write_tree(parent, pcis, node):
    for pci in pcis:
        elem = _pci_elem(parent, pci.attrs)
        if pci.device is not None:
            _device_children(elem, pci, node)
        else:
            _write_tree(elem, pci.children, node)


def to_xml(node):
    """NodeTopology -> NCCL topology XML text (str).

    A node read from an XML file is written back with its PCI tree. Otherwise GPUs and NICs
    need PCI bus ids (from NVML/amdsmi and sysfs); each group of GPUs and NICs at ``PIX`` or
    ``PXB`` from each other is placed behind one synthetic PCIe switch (bus id
    ``ffff:ff:NN.0``, as Azure's published NDv5 file does) under the CPU of its NUMA node, so
    NCCL pairs them the same way. Raises TopologyError when a device has no bus id.
    """
    version = "2" if any(g.vendor == "amd" for g in node.gpus) else "1"
    root = ET.Element("system", {"version": version})
    if node.pci_roots:
        for numa, affinity, attrs in node.cpus:
            cpu = ET.SubElement(root, "cpu", attrs)
            _write_tree(cpu, node.pci_roots.get(numa, []), node)
    else:
        _synthesize(root, node)
    ET.indent(root, "  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def _synthesize(root, node):
    missing = [d.name for d in list(node.gpus) + list(node.nics) if not d.busid]
    if missing:
        raise TopologyError("no PCI bus id for %s; an NCCL topology file needs them (collect this node with "
                            "NVML/amdsmi and sysfs: 'slurmbox topology generate --format nccl-xml' on the node)"
                            % ", ".join(missing))
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for (gpu, nic), level in sorted(node.gpu_nic.items()):
        if level in ("PIX", "PXB"):
            parent[find(("nic", nic))] = find(("gpu", gpu))
    for (a, b), level in sorted(node.gpu_links.items()):
        if level in ("PIX", "PXB"):
            parent[find(("gpu", b))] = find(("gpu", a))
    groups = {}
    for gpu in node.gpus:
        groups.setdefault(find(("gpu", gpu.name)), []).append(gpu)
    for nic in node.nics:
        groups.setdefault(find(("nic", nic.name)), []).append(nic)
    numa_of = {}
    for key, members in groups.items():
        numas = [m.numa for m in members if isinstance(m, Gpu) and m.numa is not None] + \
            [m.numa for m in members if isinstance(m, Nic) and m.numa is not None]
        numa_of[key] = numas[0] if numas else 0
    cpus = {}
    for numa, affinity, attrs in node.cpus:
        cpus[numa] = attrs
    switch_no = 0
    for numa in sorted(set(numa_of.values())):
        cpu = ET.SubElement(root, "cpu", cpus.get(numa, {"numaid": str(numa)}))
        for key in sorted((k for k in groups if numa_of[k] == numa), key=lambda k: groups[k][0].busid):
            members = groups[key]
            holder = cpu
            if len(members) > 1:
                switch_no += 1
                holder = _pci_elem(cpu, dict({"busid": "ffff:ff:%02x.0" % switch_no, "class": BRIDGE_CLASS,
                                              "vendor": "0xffff", "device": "0xffff", "subsystem_vendor": "0xffff",
                                              "subsystem_device": "0xffff"}, **DEFAULT_LINK))
            done = set()
            for member in members:
                if member.busid in done:
                    continue
                done.add(member.busid)
                if isinstance(member, Gpu):
                    klass = "0x120000" if member.vendor == "amd" else "0x030200"
                    elem = _pci_elem(holder, dict({"busid": member.busid, "class": klass}, **DEFAULT_LINK))
                    _gpu_links_elem(elem, member, node)
                else:
                    elem = _pci_elem(holder, dict({"busid": member.busid, "class": "0x020700"}, **DEFAULT_LINK))
                    _nic_elem(elem, [n for n in node.nics if n.busid == member.busid])


def nearest_nic_busids(node):
    """{gpu busid: sorted bus ids of its nearest NICs}: the pairing NCCL derives."""
    by_name = {n.name: n.busid for n in node.nics}
    return {g.busid: sorted(by_name[n] for n in node.nearest_nics(g.name)) for g in node.gpus}
