"""``nvidia-smi topo -m`` and ``nvidia-smi topo -p2p <r|w|n|a|p>`` text into a
:class:`NodeTopology`.

``topo -m`` prints a matrix: a header row of device columns (``GPU0 ... NIC0 ...``, older
drivers name NIC columns ``mlx5_0``), then ``CPU Affinity``, ``NUMA Affinity`` and, on
newer drivers, ``GPU NUMA ID``; one row per device with ``X`` on the diagonal and a level
(``NV#``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``; ``SOC`` is the pre-2018 name of
``SYS``) per cell; then an optional ``Legend:`` and ``NIC Legend:`` (``NIC0: mlx5_0``).
Columns are tab-separated as nvidia-smi prints them, but copies re-spaced by hand, ANSI
colour codes (``nvidia-smi topo -m`` colours on a terminal) and a shell prompt line
before the header are accepted.
"""

import re

from .model import Gpu, Nic, NodeTopology, TopologyError, level_rank

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_GPU = re.compile(r"^GPU(\d+)$")


def _clean(text):
    return _ANSI.sub("", text).replace("\r", "")


def _header(lines):
    """Index of the header line and its device column names."""
    for index, line in enumerate(lines):
        tokens = line.split()
        if tokens and _GPU.match(tokens[0]):
            columns = []
            for token in tokens:
                if token in ("CPU", "NUMA", "GPU") and columns:
                    break
                columns.append(token)
            return index, columns
    raise TopologyError("no header row starting with GPU0 found; is this 'nvidia-smi topo' output?")


def parse_topo_matrix(text, host=None):
    """``nvidia-smi topo -m`` text -> NodeTopology with gpus, nics, gpu_links, gpu_nic.

    Raises TopologyError on a missing header, a row of the wrong width or an unknown level.
    """
    lines = _clean(text).splitlines()
    start, columns = _header(lines)
    node = NodeTopology(host)
    legend = {}
    for line in lines:
        match = _NIC_LEGEND.match(line)
        if match:
            legend[match.group(1)] = match.group(2)
    rows = {}
    for line in lines[start + 1:]:
        tokens = line.split()
        if not tokens or tokens[0] not in columns:
            if rows and (not tokens or tokens[0].endswith(":")):
                break
            continue
        if len(tokens) < len(columns) + 1:
            raise TopologyError("row %s has %d cells for %d columns" % (tokens[0], len(tokens) - 1, len(columns)))
        rows[tokens[0]] = tokens[1:]
    is_gpu = {c: bool(_GPU.match(c)) for c in columns}
    names = {c: (c if is_gpu[c] else legend.get(c, c)) for c in columns}
    for column in columns:
        cells = rows.get(column)
        if cells is None:
            raise TopologyError("column %s has no row" % column)
        extra = cells[len(columns):]
        if is_gpu[column]:
            numa = None
            if len(extra) >= 2 and extra[1].isdigit():
                numa = int(extra[1])
            node.gpus.append(Gpu(int(column[3:]), column, numa=numa, cpu_affinity=extra[0] if extra else None))
        else:
            node.nics.append(Nic(names[column]))
    for a in columns:
        for b, cell in zip(columns, rows[a][:len(columns)]):
            if a == b or cell == "X":
                continue
            level = "SYS" if cell == "SOC" else cell
            level_rank(level)  # raises on an unknown level
            if is_gpu[a] and is_gpu[b]:
                node.set_link(a, b, level)
            elif is_gpu[a]:
                node.gpu_nic[(a, names[b])] = level
    return node


def parse_p2p(text, node=None, host=None):
    """``nvidia-smi topo -p2p r`` (or w/n/a/p) text -> NodeTopology with ``p2p`` statuses
    ({(gpu, gpu): "OK"|"CNS"|"GNS"|"TNS"|"NS"|"U"}); adds to ``node`` when given."""
    lines = _clean(text).splitlines()
    start, columns = _header(lines)
    node = node or NodeTopology(host)
    known = {g.name for g in node.gpus}
    for line in lines[start + 1:]:
        tokens = line.split()
        if not tokens or tokens[0] not in columns:
            continue
        row = tokens[0]
        if row not in known:
            node.gpus.append(Gpu(int(row[3:]), row))
            known.add(row)
        for col, cell in zip(columns, tokens[1:]):
            if col != row and cell != "X":
                node.p2p[(row, col) if row < col else (col, row)] = cell
    return node


def looks_like(text):
    """True when ``text`` looks like ``nvidia-smi topo`` output."""
    try:
        _header(_clean(text).splitlines())
    except TopologyError:
        return False
    return True
