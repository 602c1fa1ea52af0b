"""AMD GPU topology text into a :class:`NodeTopology`: ``rocm-smi --showtopo``,
``amd-smi topology`` (tables) and ``amd-smi topology --json``.

Both tools print a weight, a hop count and a link type per GPU pair. The hop count reads 1
for every XGMI pair (a fully connected hive), so it says nothing about nearness; the link
type (``XGMI``/``PCIE``) and the weight (lower is nearer; 15 for XGMI on MI300) are what
the model keeps. A PCIe pair becomes ``NODE`` when both GPUs are on the same NUMA node and
``SYS`` otherwise (or when NUMA is unknown), matching nvidia-smi's level names.

Formats: rocm-smi (ROCm SMI CLI) prints ``=== Weight between two GPUs ===``, ``Hops ...``,
``Link Type ...`` and ``Numa Nodes`` sections with ``GPU0 ...`` matrices and
``GPU[0] : (Topology) Numa Node: 0`` lines; amd-smi prints ``WEIGHT TABLE:``, ``HOPS
TABLE:``, ``LINK TYPE TABLE:``, ``ACCESS TABLE:``, ``NUMA BW TABLE:`` with PCI BDFs as row
and column names (diagonal ``SELF``/``0``/``N/A``); ``--json`` gives a list of
``{"gpu", "bdf", "links": [{"gpu", "bdf", "weight", "link_type", "num_hops", ...}]}``.
"""

import json
import re

from .model import Gpu, NodeTopology, TopologyError

_ROCM_SECTION = re.compile(r"=+\s*(Weight|Hops|Link Type) between two GPUs\s*=+")
_AMDSMI_SECTION = re.compile(r"^(ACCESS|WEIGHT|HOPS|LINK TYPE|NUMA BW) TABLE:\s*$")
_NUMA = re.compile(r"GPU\[(\d+)\]\s*:\s*\(Topology\) Numa Node:\s*(-?\d+)")
_BDF = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _tables(lines, section_re):
    """{section name: (columns, {row: cells})} from matrix sections."""
    tables, name, columns = {}, None, None
    for line in lines:
        match = section_re.search(line)
        if match:
            name, columns = match.group(1).upper(), None
            tables[name] = ([], {})
            continue
        if name is None:
            continue
        tokens = line.split()
        if not tokens or tokens[0].startswith("="):
            if columns:
                name = None
            continue
        if columns is None:
            columns = tokens
            tables[name] = (columns, {})
        elif tokens[0] in columns:
            tables[name][1][tokens[0]] = tokens[1:]
    return tables


def _pair_level(kind, numa_a, numa_b):
    kind = kind.upper()
    if kind == "XGMI":
        return "XGMI"
    if kind in ("PCIE", "PCI"):
        return "NODE" if numa_a is not None and numa_a == numa_b and numa_a >= 0 else "SYS"
    return None


def _build(columns, link_types, weights, numa, bdfs):
    node = NodeTopology()
    names = {}
    for index, col in enumerate(columns):
        name = "GPU%d" % index
        names[col] = name
        node.gpus.append(Gpu(index, name, busid=bdfs.get(col), numa=numa.get(index), vendor="amd"))
    for a_index, a in enumerate(columns):
        for b_index, b in enumerate(columns):
            if b_index <= a_index:
                continue
            kind = link_types.get((a, b))
            if kind:
                level = _pair_level(kind, numa.get(a_index), numa.get(b_index))
                if level:
                    node.set_link(names[a], names[b], level)
            weight = weights.get((a, b))
            if weight is not None:
                node.gpu_weights[(names[a], names[b])] = weight
    return node


def _matrix(table):
    columns, rows = table
    cells = {}
    for row, values in rows.items():
        for col, value in zip(columns, values):
            cells[(row, col)] = value
    return cells


def parse_rocm_smi(text):
    """``rocm-smi --showtopo`` text -> NodeTopology; TopologyError without a Link Type table."""
    lines = text.splitlines()
    tables = _tables(lines, _ROCM_SECTION)
    if "LINK TYPE" not in tables or not tables["LINK TYPE"][0]:
        raise TopologyError("no 'Link Type between two GPUs' table; is this rocm-smi --showtopo output?")
    columns = tables["LINK TYPE"][0]
    numa = {int(m.group(1)): int(m.group(2)) for m in _NUMA.finditer(text)}
    weights = {k: int(v) for k, v in _matrix(tables.get("WEIGHT", ([], {}))).items() if v.isdigit()}
    return _build(columns, _matrix(tables["LINK TYPE"]), weights, numa, {})


def parse_amd_smi_tables(text):
    """``amd-smi topology`` text (tables with BDF names) -> NodeTopology with GPU bus ids."""
    lines = text.splitlines()
    tables = _tables(lines, _AMDSMI_SECTION)
    if "LINK TYPE" not in tables or not tables["LINK TYPE"][0]:
        raise TopologyError("no 'LINK TYPE TABLE:'; is this amd-smi topology output?")
    columns = tables["LINK TYPE"][0]
    weights = {k: int(v) for k, v in _matrix(tables.get("WEIGHT", ([], {}))).items() if v.isdigit()}
    bdfs = {c: c for c in columns if _BDF.match(c)}
    return _build(columns, _matrix(tables["LINK TYPE"]), weights, {}, bdfs)


def _lenient_json(text):
    """JSON with the shortcuts of documentation excerpts: a ``$ command`` line, ``...``
    elisions and trailing commas."""
    body = "\n".join(line for line in text.splitlines()
                     if not line.lstrip().startswith("$") and line.strip() not in ("...", "...,"))
    body = re.sub(r",(\s*[\]}])", r"\1", body)
    return json.loads(body)


def parse_amd_smi_json(text):
    """``amd-smi topology --json`` text -> NodeTopology (GPUs named from the ``gpu`` index)."""
    try:
        data = _lenient_json(text)
    except ValueError as err:
        raise TopologyError("amd-smi topology --json: not JSON (%s)" % err)
    if isinstance(data, dict):
        data = [data]
    node = NodeTopology()
    gpus = {}

    def add(index, bdf):
        if index not in gpus:
            gpus[index] = Gpu(index, "GPU%d" % index, busid=bdf, vendor="amd")

    for entry in data:
        if not isinstance(entry, dict) or "gpu" not in entry:
            raise TopologyError("amd-smi topology --json: each entry needs a 'gpu' key")
        add(entry["gpu"], entry.get("bdf"))
        for link in entry.get("links", []):
            add(link["gpu"], link.get("bdf"))
            if link["gpu"] == entry["gpu"]:
                continue
            a, b = "GPU%d" % entry["gpu"], "GPU%d" % link["gpu"]
            level = _pair_level(str(link.get("link_type", "")), None, None)
            if level:
                node.set_link(a, b, level)
            if isinstance(link.get("weight"), int):
                node.gpu_weights[(a, b) if a < b else (b, a)] = link["weight"]
    node.gpus = [gpus[i] for i in sorted(gpus)]
    return node


def parse(text):
    """Any of the three AMD formats (detected) -> NodeTopology."""
    if _ROCM_SECTION.search(text):
        return parse_rocm_smi(text)
    if re.search(r"^LINK TYPE TABLE:", text, re.M):
        return parse_amd_smi_tables(text)
    if text.lstrip().startswith(("[", "{", "$")):
        return parse_amd_smi_json(text)
    raise TopologyError("not rocm-smi --showtopo or amd-smi topology output")
