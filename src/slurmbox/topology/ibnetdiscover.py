"""Read ``ibnetdiscover`` output (infiniband-diags) into a :class:`Fabric`.

Format (ibnetdiscover(8), "TOPOLOGY FILE FORMAT"): node sections separated by blank lines,
each with ``vendid=``/``devid=``/``sysimgguid=``/``switchguid=``/``caguid=`` lines, a header

    Switch  36 "S-<guid>"  # "<NodeDescription>" base port 0 lid 15 lmc 0
    Ca      2 "H-<guid>"   # "<NodeDescription>"

and one line per cabled port:

    [23]  "H-<guid>"[2](<portguid>)  # "<remote NodeDescription>" lid 14 4xQDR     (switch)
    [2](<portguid>)  "S-<guid>"[23]  # lid 14 lmc 0 "<remote desc>" lid 15 4xQDR   (CA)

Each cable is printed from both ends; it is kept once. Lines that fit none of these
(stderr noise such as ``src/query_smp.c:195; umad ... Connection timed out``, chassis
headers) are skipped and counted in ``Fabric.warnings``. SHARP aggregation nodes (a CA
whose description says "Aggregation Node") are left out: they are switch-internal.

The host of a CA is the first word of its NodeDescription ("r-ufm101 HCA-1" ->
"r-ufm101"), unless the description is a vendor default naming no host (it starts with
"MT<digits>" or mentions "Mellanox Technologies"); such CAs keep ``host=None`` until
:meth:`Fabric.map_guids` gives them one from the node's ``ibstat``/pyverbs GUIDs.
"""

import os
import re
import subprocess
from itertools import repeat

from .hostlists import is_host_name
from .ibnetdiscover_sections import split_sections, split_stream
from .model import Fabric, FabricNode, Link, TopologyError, no_gc

_DEFAULT_MARKERS = ("Mellanox Technologies", "InfiniHost", "ConnectX", "Voltaire")
_SPEED = re.compile(r"^(\d+)x([A-Z]+\d*)$")
_BLANK_OR_COMMENT = frozenset(("", "#", " ", "\t", "\n", "\r"))
# Attribute lines ("vendid=0x2c9"), by first character: one startswith test per line.
_ATTRIBUTES = {"v": "vendid=", "d": "devid=", "s": ("sysimgguid=", "switchguid="), "c": "caguid=",
               "r": "routerguid="}
_KINDS = {"Switch": "switch", "Ca": "ca", "Rt": "router"}


#: Host names, one per line (see hostlists.is_host_name).
_HOST_LINES = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9_.-]*\n)*[A-Za-z0-9][A-Za-z0-9_.-]*")


def hosts_from_descriptions(descriptions):
    """[host_from_description(d) for d in descriptions] (list of str), for many at once.

    When no description names a vendor default and every first word (up to the first
    space) is a plain host name, that word is the host: checked with one regular
    expression over all of them. Otherwise one by one.
    """
    joined = "\n".join(descriptions)
    if not ("MT" in joined or "Mellanox Technologies" in joined or "InfiniHost" in joined or "ConnectX" in joined
            or "Voltaire" in joined):
        firsts = [d.partition(" ")[0] for d in descriptions]
        if _HOST_LINES.fullmatch("\n".join(firsts)) is not None:
            return firsts
    return list(map(host_from_description, descriptions))


def _slower(width, speed, link):
    other = Link("", 0, "", 0, width, speed).rate_gbps
    return other is not None and (link.rate_gbps is None or other < link.rate_gbps)


def host_from_description(description):
    """Host name in an HCA NodeDescription, or None for a vendor default description.

    "compute-00-01 HCA-1" -> "compute-00-01"; "MT23108 InfiniHost Mellanox Technologies" -> None;
    a first word that is not a plain host name ("a,b[1-9]", "Nodes=x") -> None.
    """
    description = description.strip()
    if not description or (description[:2] == "MT" and description[2:3].isdigit()):
        return None
    if ("Mellanox Technologies" in description or "InfiniHost" in description or "ConnectX" in description
            or "Voltaire" in description):  # _DEFAULT_MARKERS, spelt out: this runs once per HCA
        return None
    host = description.split(None, 1)[0]
    return host if is_host_name(host) else None  # set by root on that host: never trusted as a hostlist


def _build_node(ident, row):
    """The FabricNode of a node row (see _parse_lines); its LID is read from the header's
    text after the description only now."""
    kind, host, description, ports, rest, guid = row
    rest = rest.partition("\n")[0]  # the bulk reader's header text may run into the first port line
    lid = None
    if " lid " in rest:
        try:
            lid = int(rest.split(" lid ", 1)[1].split()[0])
        except (ValueError, IndexError):
            lid = None
    return FabricNode(ident, kind, description, ports, host, lid, guid)


def parse(text, name="ibnetdiscover"):
    """Parse ibnetdiscover ``text`` (str) into a Fabric named ``name``.

    Raises TopologyError when the text has no node section at all (wrong file).
    """
    if "\r" in text:  # as reading a file in text mode does (universal newlines)
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    with no_gc():
        return _parse_text(text, name)


def parse_lines(lines, name="ibnetdiscover"):
    """Parse an iterable of ibnetdiscover lines (see :func:`parse`), line by line."""
    with no_gc():
        return _read_in_order((line.rstrip("\n") for line in lines), name).finish()


def _parse_text(text, name):
    """Fabric of ``text`` (newlines "\n"): its regular sections read in bulk
    (:mod:`.ibnetdiscover_sections`), the rest line by line; links and warnings deferred."""
    return _fabric(split_sections(text), name, lambda: _read_in_order(text.split("\n"), name))


def _fabric(regular, name, exact):
    """The Fabric of :class:`RegularSections` ``regular``; ``exact()`` reads the whole input
    line by line into a fed _State, for the links and warnings when they are asked for, or
    at once when some section with port lines is not regular."""
    if not regular.port_lines_regular:
        # An irregular section with port lines (stray lines among them, a header missing):
        # which cable such a line names depends on every line before it. Read it all, in
        # order, line by line, as the links would be.
        return exact().finish()
    state = _State(name)
    state.feed(regular.rest.split("\n"))
    nodes, sharp, kinds = state.nodes, state.sharp, state.headers
    irregular_nodes = len(nodes)
    # Each node's cabled neighbours as its own section names them: all that trees need.
    sightings = []
    for prefix, ident, description, rest, far in regular.several:
        kind, ports = _header_kind(kinds, prefix)
        host = None
        if kind == "ca":
            host = host_from_description(description)
            if "Aggregation Node" in description:
                sharp.add(ident)
        nodes[ident] = (kind, host, description, ports, rest, _guid_of(name, ident))
        sightings.append((ident, far))
    # Sections with one port line (on most fabrics: every host's CA), column by column.
    # The CAs' cables are kept as two flat lists (CA, the switch it names), which
    # Fabric._adjacency checks in bulk; any other kind's is a sighting like the above.
    prefixes, idents, descriptions, rests, remotes = regular.single
    by_prefix = {prefix: _header_kind(kinds, prefix) for prefix in set(prefixes)}
    if [kind for kind, _ in by_prefix.values()] == ["ca"]:  # the usual case: all host CAs
        kind_list, port_list = repeat("ca"), repeat(next(iter(by_prefix.values()))[1])
        hosts = hosts_from_descriptions(descriptions)
        uplinks = (idents, remotes)
    else:
        kind_list = [by_prefix[prefix][0] for prefix in prefixes]
        port_list = [by_prefix[prefix][1] for prefix in prefixes]
        hosts = [host_from_description(d) if k == "ca" else None for k, d in zip(kind_list, descriptions)]
        uplinks = ([i for i, k in zip(idents, kind_list) if k == "ca"],
                   [r for r, k in zip(remotes, kind_list) if k == "ca"])
        sightings += [(i, [r]) for i, r, k in zip(idents, remotes, kind_list) if k != "ca"]
    try:
        guids = list(map(int, [ident[2:] for ident in idents], repeat(16)))
    except ValueError:
        guids = [_guid_of(name, ident) for ident in idents]
    nodes.update(zip(idents, zip(kind_list, hosts, descriptions, port_list, rests, guids)))
    if "Aggregation Node" in "\n".join(descriptions):
        sharp.update(i for i, d in zip(idents, descriptions) if nodes[i][0] == "ca" and "Aggregation Node" in d)
    if len(nodes) != irregular_nodes + len(regular.several) + len(idents):
        # A node with two sections (files pieced together): which one counts depends on
        # their order in the file. Read it all, in order, line by line.
        return exact().finish()
    for ident in sharp:
        nodes.pop(ident, None)
    if not nodes:
        raise TopologyError("%s: no Switch/Ca sections found; is this ibnetdiscover output?" % name)
    fabric = Fabric(name, "InfiniBand")
    fabric.set_node_rows(nodes, _build_node)

    def load_links():
        # Ports, speeds and warnings need every port line: the whole input, line by line.
        return exact().links_and_warnings()

    fabric.set_deferred_links(sightings, load_links, uplinks)
    return fabric


def _read_in_order(lines, name):
    """A _State fed every one of ``lines`` (str without line breaks), in order."""
    state = _State(name)
    state.feed(lines)
    return state


def _guid_of(name, ident):
    """The GUID in node id ``ident`` (see _guid), the usual hexadecimal case first."""
    try:
        return int(ident[2:], 16)
    except ValueError:
        return _guid(name, ident)  # None for an id too short to hold one; raises for a malformed one


def _header_kind(kinds, prefix):
    """(kind, port count) of a regular header's text before its first quote ("Switch\t36 "),
    cached in ``kinds``."""
    kind_ports = kinds.get(prefix)
    if kind_ports is None:
        words = prefix.split()
        kind_ports = kinds[prefix] = (_KINDS[words[0]], int(words[1]))
    return kind_ports


class _State:
    """What the readers of one ibnetdiscover text collect: node rows, link rows, the
    first-sighting index of every cable end and the counts behind the warnings."""

    def __init__(self, name):
        self.name = name
        # ident -> (kind, host, description, port count, header text after the description,
        # guid): FabricNode objects are made from these rows on first use of Fabric.nodes
        # (Fabric.set_node_rows; _build_node), which writing a tree never needs for CAs.
        self.nodes = {}
        # (a, a_port, b, b_port, (width, speed)) (see Fabric.set_link_rows). Tuples of str
        # and int, unlike Link objects, are soon untracked by the cyclic garbage collector.
        # Port lines ending alike share one (width, speed) tuple (``speeds``), so that the
        # second sighting of a cable is usually settled by one identity test.
        self.rows = []
        # Each cable is printed from both ends; the first sighting makes the row and files
        # its index under the far end, seen[remote ident][0][remote port text], so that the
        # second sighting (printed in the remote node's section) is found without parsing it
        # further. seen[ident][1] is the first text of that ident: rows share it rather than
        # each keeping its own copy (less memory to fill on a large fabric).
        self.seen = {}
        self.speeds = {}  # last word of a port line ("4xNDR") -> (width, speed)
        # " " + the last word of the first port line (e.g. " 4xNDR") and its (width, speed):
        # most port lines end the same way.
        self.common_tail, self.common = (), (None, None)
        self.headers = {}  # text before a header's first quote -> (kind, port count)
        self.sharp = set()
        self.skipped = 0
        self.mismatched = 0

    def feed(self, lines):
        """Read ``lines`` (iterable of str, with or without their newline) one by one."""
        nodes, rows, seen, speeds, headers, sharp = (self.nodes, self.rows, self.seen, self.speeds, self.headers,
                                                     self.sharp)
        common_tail, common = self.common_tail, self.common
        skipped = mismatched = 0
        current = current_seen = None
        for line in lines:
            first = line[:1]
            if first == "[":
                if current is None:
                    skipped += 1
                    continue
                end = line.find("]")
                port = line[1:end]
                if line.endswith(common_tail):  # the usual last word: no need to cut it out
                    width_speed = common
                else:
                    last = line[line.rfind(" ") + 1:]
                    width_speed = speeds.get(last)
                    if width_speed is None:
                        found = _SPEED.match(last.strip())
                        width_speed = speeds[last] = (found.group(1) + "x", found.group(2)) if found else (None, None)
                    if not common_tail:
                        common_tail, common = " " + last.rstrip("\n"), width_speed
                known = current_seen.get(port)  # index in rows of the cable's first sighting
                if known is None:
                    parts = line.split('"', 2)
                    if len(parts) < 3 or parts[2][:1] != "[":
                        skipped += 1
                        continue
                    remote, tail = parts[1], parts[2]
                    remote_port = tail[1:tail.find("]")]
                    far = seen.get(remote)
                    if far is None:
                        far = seen[remote] = ({}, remote)
                    try:
                        row = (current, int(port), far[1], int(remote_port), width_speed)
                    except ValueError:
                        skipped += 1
                        continue
                    far[0][remote_port] = len(rows)
                    rows.append(row)
                else:
                    row = rows[known]
                    if row[4] is width_speed:  # read the same at both ends (the usual case)
                        continue
                    if row[4] != width_speed:
                        # The two ends disagree: keep the slower reading (the link runs at it).
                        mismatched += 1
                        width, speed = width_speed
                        if _slower(width, speed, Link(*row[:4], *row[4])):
                            rows[known] = row[:4] + (width_speed,)
            elif first in _ATTRIBUTES and line.startswith(_ATTRIBUTES[first]):
                continue
            elif first in _BLANK_OR_COMMENT:
                if first == "\n" or line.strip() == "":
                    current = None
                continue
            elif line.startswith(("Switch", "Ca", "Rt")) and '"' in line:
                parts = line.split('"')
                # "Switch\t36 " -> ("switch", 36); the same few texts repeat on every header.
                kind_ports = headers.get(parts[0])
                if kind_ports is None:
                    words = parts[0].split()
                    kind = _KINDS.get(words[0])
                    if kind is None or len(words) < 2 or not words[1].isdecimal():
                        skipped += 1
                        continue
                    kind_ports = headers[parts[0]] = (kind, int(words[1]))
                kind = kind_ports[0]
                ident = parts[1]
                description = parts[3] if len(parts) > 3 else ""
                guid = _guid(self.name, ident)
                if kind == "ca":
                    host = host_from_description(description)
                    if "Aggregation Node" in description:
                        sharp.add(ident)
                else:
                    host = None
                nodes[ident] = (kind, host, description, kind_ports[1],
                                parts[4].rstrip("\n") if len(parts) > 4 else "", guid)
                known = seen.get(ident)
                if known is None:
                    known = seen[ident] = ({}, ident)
                current_seen, current = known
            elif line.startswith(("Non-Chassis Nodes", "Chassis ")):
                continue
            else:
                skipped += 1
        self.common_tail, self.common = common_tail, common
        self.skipped += skipped
        self.mismatched += mismatched

    def links_and_warnings(self):
        """(link rows, warnings) of everything fed (see Fabric.set_link_rows): SHARP nodes and
        links to nodes without a section left out, each with its warning."""
        nodes, rows, seen, sharp = self.nodes, self.rows, self.seen, self.sharp
        warnings = []
        if sharp:
            rows = [r for r in rows if r[0] not in sharp and r[2] not in sharp]
            warnings.append("skipped %d SHARP aggregation node(s)" % len(sharp))
        # A port line may name a node whose own section is missing (a truncated run): keep
        # the link only when both ends are known. Both ends of every row are keys of ``seen``,
        # so when all of those have a section (the usual case) no row needs looking at.
        missing = 0
        if not seen.keys() <= nodes.keys():
            missing = sum(1 for r in rows if r[0] not in nodes or r[2] not in nodes)
        if missing:
            rows = [r for r in rows if r[0] in nodes and r[2] in nodes]
            warnings.append("dropped %d link(s) to nodes without a section" % missing)
        if self.mismatched:
            warnings.append("%d link(s) read differently from their two ends; kept the slower" % self.mismatched)
        if self.skipped:
            warnings.append("skipped %d line(s) that are not ibnetdiscover output" % self.skipped)
        return rows, warnings

    def finish(self):
        """The Fabric of everything fed, links and warnings included."""
        if not self.nodes.keys() - self.sharp:
            raise TopologyError("%s: no Switch/Ca sections found; is this ibnetdiscover output?" % self.name)
        rows, warnings = self.links_and_warnings()
        fabric = Fabric(self.name, "InfiniBand")
        fabric.set_node_rows({i: r for i, r in self.nodes.items() if i not in self.sharp}, _build_node)
        fabric.set_link_rows(rows)
        fabric.warnings.extend(warnings)
        return fabric


def _guid(name, ident):
    """The GUID (int) in node id ``ident`` ("S-<hex>"/"H-<hex>"), None for a shorter id.

    Read at parse time, not in _build_node: a malformed GUID fails the parse."""
    try:
        return int(ident[2:], 16) if len(ident) > 2 else None
    except ValueError:
        raise TopologyError('%s: node id "%s" is not S-/H- followed by a hexadecimal GUID; is this '
                            'ibnetdiscover output?' % (name, ident)) from None


def read(path):
    """Parse the ibnetdiscover output in file ``path`` (see :func:`parse`).

    The file is read 1 MiB at a time; the links, when asked for, read it again (whole),
    and raise TopologyError if it changed in between (size, mtime or inode: a rewrite
    that keeps all three is not noticed).
    Raises TopologyError when it cannot be read.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            identity = _identity(os.fstat(handle.fileno()))
            with no_gc():
                regular = split_stream(iter(lambda: handle.read(1 << 20), ""))
    except OSError as err:
        raise TopologyError("cannot read %s: %s" % (path, err.strerror))

    def exact():
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                if _identity(os.fstat(handle.fileno())) != identity:
                    raise TopologyError("%s changed since it was read; read it again" % path)
                text = handle.read()
        except OSError as err:
            raise TopologyError("cannot read %s again: %s" % (path, err.strerror))
        return _read_in_order(text.split("\n"), path)

    with no_gc():
        return _fabric(regular, path, exact)


def _identity(stat):
    """What tells one version of a file from another: (device, inode, size, mtime ns)."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def run(timeout=120):
    """Run ``ibnetdiscover`` here and parse its output (stderr ignored).

    Raises TopologyError when the command is missing or fails (e.g. no HCA here).
    """
    try:
        proc = subprocess.run(["ibnetdiscover"], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise TopologyError("ibnetdiscover is not installed (Debian package infiniband-diags)")
    except subprocess.TimeoutExpired:
        raise TopologyError("ibnetdiscover did not finish within %d s" % timeout)
    if proc.returncode != 0:
        raise TopologyError("ibnetdiscover failed (exit %d): %s; it needs a local HCA with an active port"
                            % (proc.returncode, proc.stderr.strip()[:300]))
    return parse(proc.stdout, "ibnetdiscover")
