"""The bulk reader of regular ibnetdiscover sections (topology/ibnetdiscover_sections.py)
against the line-by-line reader (ibnetdiscover.parse_lines), which is the reference.

``ibnetdiscover.parse``/``read`` take regular sections in bulk for trees and read links,
ports and warnings line by line only when asked. Whatever the text, both readers must
give the same nodes, hosts, trees, tiers, topology.conf, links and warnings. The texts
are a fat tree in ibnetdiscover's format, then the same text damaged in every way the
fast path has to notice (stray, blank-with-spaces, quote-bearing, duplicated and missing
lines, reordered sections, CRLF, dual-port CAs, SHARP nodes).
"""

import random

import pytest

from slurmbox.topology import ibnetdiscover, slurm_out
from slurmbox.topology.ibnetdiscover_sections import split_sections
from slurmbox.topology.model import Topology, TopologyError


def fabric_text(pods=2, leaves=3, hosts=4, cores=2, rng=None):
    """ibnetdiscover text (with attribute lines and a comment header, as the tool prints
    it) of a three-tier fat tree: every leaf to every aggregation switch of its pod,
    aggregation switch j of every pod to core j, two cables each."""
    guid = iter(range(0x98039b0300001000, 0x98039b0300100000))
    core = ["S-%016x" % next(guid) for _ in range(cores)]
    agg = [["S-%016x" % next(guid) for _ in range(cores)] for _ in range(pods)]
    leaf = [["S-%016x" % next(guid) for _ in range(leaves)] for _ in range(pods)]
    ports, desc = {}, {}

    def cable(a, b):
        pa, pb = ports.setdefault(a, []), ports.setdefault(b, [])
        pa.append((b, len(pb) + 1))
        pb.append((a, len(pa)))

    cas = []
    for p in range(pods):
        for i, sw in enumerate(leaf[p]):
            desc[sw] = "MF0;leaf-%d-%d:MQM8700/U1" % (p, i)
            for h in range(hosts):
                ca = "H-%016x" % next(guid)
                desc[ca] = "gpu-%d-%d-%d mlx5_0" % (p, i, h)
                cas.append(ca)
                cable(sw, ca)
            for ag in agg[p]:
                cable(sw, ag)
        for j, ag in enumerate(agg[p]):
            desc[ag] = "MF0;agg-%d-%d:MQM8700/U1" % (p, j)
            cable(ag, core[j])
            cable(ag, core[j])
    for j, co in enumerate(core):
        desc[co] = "MF0;core-%d:MQM8700/U1" % j
    speed = (lambda: rng.choice(["4xNDR", "4xHDR"])) if rng else (lambda: "4xNDR")
    out = ["#", "# Topology file: generated on Mon Nov 30 01:00:00 2026", "#", ""]
    for sw in core + [a for pod in agg for a in pod] + [x for pod in leaf for x in pod]:
        out += ["vendid=0x2c9", "devid=0xd2f0", "sysimgguid=0x%s" % sw[2:], "switchguid=0x%s(%s)" % (sw[2:], sw[2:]),
                'Switch\t64 "%s"\t\t# "%s" enhanced port 0 lid 1 lmc 0' % (sw, desc[sw])]
        for port, (peer, peer_port) in enumerate(ports[sw], 1):
            guid_part = "(%s)" % peer[2:] if peer.startswith("H-") else ""
            out.append('[%d]\t"%s"[%d]%s\t\t# "%s" lid 2 %s' % (port, peer, peer_port, guid_part, desc[peer], speed()))
        out.append("")
    for ca in cas:
        peer, peer_port = ports[ca][0]
        out += ["vendid=0x2c9", "devid=0x1021", "sysimgguid=0x%s" % ca[2:], "caguid=0x%s" % ca[2:],
                'Ca\t1 "%s"\t\t# "%s"' % (ca, desc[ca]),
                '[1](%s)\t"%s"[%d]\t\t# lid 3 lmc 0 "%s" lid 1 %s' % (ca[2:], peer, peer_port, desc[peer], speed()), ""]
    return "\n".join(out)


def everything(fabric):
    """All a reader's result says, in comparable form (node order aside)."""
    topo = Topology()
    topo.fabrics.append(fabric)
    try:
        tree = slurm_out.write_tree(topo)
    except TopologyError as err:
        tree = "no tree: %s" % err
    return {"nodes": {i: n.as_dict() for i, n in fabric.nodes.items()}, "hosts": fabric.hosts(),
            "tiers": fabric.tiers(), "trees": [(t.root, t.children, t.hosts, t.tier) for t in fabric.trees()],
            "tree": tree, "links": [link.as_dict() for link in fabric.links], "warnings": fabric.warnings}


def assert_same_as_line_by_line(text):
    bulk = everything(ibnetdiscover.parse(text, "f"))
    reference = everything(ibnetdiscover.parse_lines(text.replace("\r\n", "\n").split("\n"), "f"))
    for key in reference:
        assert bulk[key] == reference[key], key
    return bulk


def test_a_clean_fabric_is_read_in_bulk_except_its_first_section():
    text = fabric_text()
    regular = split_sections(text)
    # The comment lines above the first switch are lines before its header: still regular.
    assert regular.rest == ""
    assert len(regular.several) == 2 + 4 + 6 and len(regular.single[1]) == 24  # switches; one-port CAs
    result = assert_same_as_line_by_line(text)
    assert len(result["hosts"]) == 24 and result["warnings"] == []
    assert "SwitchName=" in result["tree"]


def test_deferred_links_are_read_once_and_only_when_asked():
    fabric = ibnetdiscover.parse(fabric_text(), "f")
    assert fabric._load_links is not None  # trees need no port line read one by one
    fabric.trees()
    assert fabric._load_links is not None
    links = fabric.links
    assert fabric._load_links is None and fabric.links is links
    assert len(links) == 2 * 3 * 4 + 2 * 3 * 2 + 2 * 2 * 2


def _lines_of(text):
    return text.split("\n")


DAMAGE = {
    "stray line after a header": lambda lines, rng: _insert(lines, rng, "ibwarn: [4242] mad_rpc: _do_madrpc failed"),
    "stray line with quotes": lambda lines, rng: _insert(lines, rng, 'src/x.c:1; "S-00"[3] "y"'),
    "blank line with spaces": lambda lines, rng: _insert(lines, rng, "   "),
    "empty line": lambda lines, rng: _insert(lines, rng, ""),
    "port line without quotes": lambda lines, rng: _insert(lines, rng, "[60]\t-"),
    "line dropped": lambda lines, rng: _drop(lines, rng),
    "line repeated": lambda lines, rng: _repeat(lines, rng),
    "quote in a description": lambda lines, rng: _edit(lines, rng, '"gpu', '"gp"u'),
    "remote port not a number": lambda lines, rng: _edit(lines, rng, '"[1', '"[x'),
    "speed read differently": lambda lines, rng: _edit(lines, rng, "4xNDR", "4xEDR"),
    "header without description": lambda lines, rng: _edit(lines, rng, '\t\t# "gpu', '\t\t# gpu'),
    "a second port cabled on a CA": lambda lines, rng: _second_ca_port(lines, rng),
    "SHARP aggregation node": lambda lines, rng: _edit(lines, rng, "mlx5_0", "Mellanox Technologies Aggregation Node"),
}


def _insert(lines, rng, new):
    lines.insert(rng.randrange(len(lines) + 1), new)


def _drop(lines, rng):
    del lines[rng.randrange(len(lines))]


def _repeat(lines, rng):
    index = rng.randrange(len(lines))
    lines.insert(index, lines[index])


def _edit(lines, rng, old, new):
    candidates = [i for i, line in enumerate(lines) if old in line]
    if candidates:
        index = rng.choice(candidates)
        lines[index] = lines[index].replace(old, new, 1)


def _second_ca_port(lines, rng):
    candidates = [i for i, line in enumerate(lines) if line.startswith("[1](")]
    if candidates:
        index = rng.choice(candidates)
        lines.insert(index + 1, lines[index].replace("[1](", "[2](", 1).replace('"[', '"[6', 1))


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_each_kind_of_damage_reads_as_line_by_line(damage):
    for seed in range(12):
        rng = random.Random("%s %d" % (damage, seed))
        lines = _lines_of(fabric_text(rng=rng))
        for _ in range(rng.randint(1, 3)):
            DAMAGE[damage](lines, rng)
        assert_same_as_line_by_line("\n".join(lines))


def test_mixed_damage_reordered_sections_and_crlf_read_as_line_by_line():
    for seed in range(40):
        rng = random.Random(seed)
        lines = _lines_of(fabric_text(pods=rng.randint(1, 3), leaves=rng.randint(1, 3), hosts=rng.randint(1, 3),
                                      rng=rng))
        for _ in range(rng.randint(0, 6)):
            DAMAGE[rng.choice(sorted(DAMAGE))](lines, rng)
        text = "\n".join(lines)
        if seed % 3 == 0:
            sections = text.split("\n\n")
            rng.shuffle(sections)
            text = "\n\n".join(sections)
        if seed % 5 == 0:
            text = text.replace("\n", "\r\n")
        assert_same_as_line_by_line(text)


def _bulk_read(text):
    """True when parse() took the bulk path (links deferred), False when it read every line."""
    return ibnetdiscover.parse(text, "f")._load_links is not None


def test_damage_outside_port_lists_keeps_the_bulk_path_and_its_answer():
    lines = _lines_of(fabric_text(rng=random.Random(3)))
    headers = [i for i, line in enumerate(lines) if line.startswith(("Switch", "Ca"))]
    del lines[headers[12] - 2]  # an attribute line
    lines.insert(headers[9], "Chassis 0x0002c90200405a8c")
    lines.insert(headers[5], "ibwarn: [4242] mad_rpc: _do_madrpc failed; dport (DR path slid 0; dlid 0; 0,1)")
    port_lines = [i for i, line in enumerate(lines) if line.startswith("[")]
    del lines[port_lines[7]]  # a cable seen from one end only
    lines[port_lines[20]] = lines[port_lines[20]].replace("4xNDR", "4xEDR").replace("4xHDR", "4xEDR")
    sections = "\n".join(lines).split("\n\n")
    random.Random(4).shuffle(sections)
    for text in ("\n\n".join(sections), "\n\n".join(sections).replace("\n", "\r\n")):
        assert _bulk_read(text)
        result = assert_same_as_line_by_line(text)
        assert any("read differently" in w for w in result["warnings"]), result["warnings"]


def test_a_stray_line_among_port_lines_sends_the_whole_text_line_by_line():
    lines = _lines_of(fabric_text())
    port_lines = [i for i, line in enumerate(lines) if line.startswith("[")]
    lines.insert(port_lines[3], "src/query_smp.c:195; umad (DR path slid 0; dlid 0; 0,1,7,31) Attr 0x11:0 : status 0x0")
    text = "\n".join(lines)
    assert not _bulk_read(text)
    result = assert_same_as_line_by_line(text)
    assert "skipped 1 line(s) that are not ibnetdiscover output" in result["warnings"]


def test_hosts_of_many_descriptions_are_those_of_each():
    rng = random.Random(5)
    alphabet = ["a", "Z", "0", "9", "-", ".", "_", " ", "\t", ",", "[", "M", "T", "4"]
    samples = [["gpu00001 mlx5_0", "compute-00-01 HCA-1", "n1"], [" leading space", "gpu2 x"],
               ["MT23108 InfiniHost Mellanox Technologies"], ["r1 ConnectX-7"], ["gpu1\tmlx5_0"], ["", "a"],
               ["a,b[1-2] x"], ["-dash first"]]
    samples += [["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(1, 6))]
                for _ in range(300)]
    for descriptions in samples:
        assert ibnetdiscover.hosts_from_descriptions(descriptions) == \
            [ibnetdiscover.host_from_description(d) for d in descriptions], descriptions


def _fields(regular):
    return (sorted(regular.several), [sorted(zip(*regular.single))], regular.rest, regular.port_lines_regular)


def test_reading_in_chunks_of_any_size_finds_the_same_sections():
    from slurmbox.topology.ibnetdiscover_sections import split_stream
    rng = random.Random(11)
    texts = [fabric_text(rng=rng)]
    for seed in range(6):
        lines = _lines_of(fabric_text(rng=random.Random(seed)))
        DAMAGE[sorted(DAMAGE)[seed % len(DAMAGE)]](lines, random.Random(seed))
        texts.append("\n".join(lines) + "\n\n\n")
    for text in texts:
        whole = split_sections(text)
        for size in (1, 7, 64, 500, 4096, len(text)):
            chunks = [text[i:i + size] for i in range(0, len(text), size)]
            streamed = split_stream(chunks)
            assert streamed.port_lines_regular == whole.port_lines_regular, size
            if whole.port_lines_regular:
                assert _fields(streamed)[:2] == _fields(whole)[:2], size


def test_a_file_reads_as_its_text_and_its_links_notice_a_change(tmp_path):
    text = fabric_text(rng=random.Random(2))
    path = tmp_path / "fabric.txt"
    path.write_text(text)
    from_file, from_text = everything(ibnetdiscover.read(str(path))), everything(ibnetdiscover.parse(text, str(path)))
    assert from_file == from_text
    fabric = ibnetdiscover.read(str(path))
    path.write_text(text.replace("4xNDR", "4xEDR"))
    with pytest.raises(TopologyError, match="changed since it was read"):
        fabric.links


_A, _B, _C = 'Switch 2 "S-a" # "a"\n', 'Switch 2 "S-b" # "b"\n', 'Switch 2 "S-c" # "c"\n'
_H1, _H2 = 'Ca 1 "H-1" # "h1"\n', 'Ca 1 "H-2" # "h2"\n'


def _port(n, remote, remote_port):
    return '[%d] "%s"[%d] # "x"\n' % (n, remote, remote_port)


@pytest.mark.parametrize("text", [
    # a header after white space is no header to a line reader
    _A + _port(1, "H-1", 1) + "\n " + _H1 + _port(1, "S-a", 1),
    _A + _port(1, "H-1", 1) + '\n Switch 2 "S-zz" # "z"\n',
    # a node with two sections: the later one counts
    _A + _port(1, "H-1", 1) + "\n" + _H1 + _port(1, "S-a", 1) + '\nCa 1 "H-1" # "h9" "\n',
    _A + _port(1, "H-1", 1) + '\nSwitch 1 "H-1" # "Aggregation Node"\n' + _port(1, "S-a", 1) + "\n" + _H1
    + _port(1, "S-a", 1),
    # the two ends of a cable disagree (recabled, pieced together): the first sighting counts
    _A + _port(1, "H-1", 1) + _port(2, "S-b", 5) + "\n" + _B + _port(5, "S-c", 1) + "\n" + _C + _port(2, "H-2", 1)
    + "\n" + _H1 + _port(1, "S-a", 1) + "\n" + _H2 + _port(1, "S-c", 2),
    _H1 + _port(1, "S-b", 1) + "\n" + _A + _port(1, "H-1", 1) + "\n" + _B,
    # a header whose port count is not a number is a stray line
    'Ca x "H-1" # "h"\n' + _port(1, "S-a", 1) + "\n" + _A + _port(1, "H-1", 1),
], ids=["space-header", "space-header-bad-id", "duplicate-ca", "duplicate-sharp", "ends-disagree",
        "ca-first-disagree", "port-count-not-a-number"])
def test_pieced_together_and_odd_inputs_read_as_line_by_line(text):
    assert_same_as_line_by_line(text)


def test_a_failed_second_read_leaves_the_fabric_as_it_was(tmp_path):
    path = tmp_path / "fabric.txt"
    path.write_text(fabric_text())
    fabric = ibnetdiscover.read(str(path))
    trees = [(t.root, t.children) for t in fabric.trees()]
    path.write_text(fabric_text() + "\n")
    for _ in range(2):
        with pytest.raises(TopologyError, match="changed since it was read"):
            fabric.links
    assert [(t.root, t.children) for t in fabric.trees()] == trees
