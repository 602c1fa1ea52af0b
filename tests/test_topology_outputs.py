"""Slurm topology files, NCCL topology XML, placement and NCCL hints written from the model."""

import os
import random

import pytest

from slurmbox.topology import (ibnetdiscover, nccl_hints, nccl_xml, nvidia_smi, override, place, sandbox_hints,
                               slurm_conf, slurm_out, sources)
from slurmbox.topology.model import Gpu, Nic, NicPort, NodeTopology, Topology, TopologyError

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "topology")


def sample(path):
    return os.path.join(DATA, path)


def read(path):
    with open(sample(path), encoding="utf-8") as handle:
        return handle.read()


def fat_tree_text(pods=2, leaves=2, hosts=2, spines=2):
    """ibnetdiscover text of a small 3-tier fat tree (core, per-pod aggregation, leaves)."""
    lines = []
    guid = iter(range(0x1000, 0x100000))
    cores = ["S-%016x" % next(guid) for _ in range(spines)]
    aggs = [["S-%016x" % next(guid) for _ in range(spines)] for _ in range(pods)]
    leaf = [[("S-%016x" % next(guid)) for _ in range(leaves)] for _ in range(pods)]
    cas = [[[("H-%016x" % next(guid), "p%dl%dh%d" % (p, l, h)) for h in range(hosts)] for l in range(leaves)]
           for p in range(pods)]
    ports = {}

    def link(a, b):
        ports.setdefault(a, []).append(b)
        ports.setdefault(b, []).append(a)

    for p in range(pods):
        for s in range(spines):
            link(cores[s], aggs[p][s])
            for l in range(leaves):
                link(aggs[p][s], leaf[p][l])
        for l in range(leaves):
            for ca, _ in cas[p][l]:
                link(leaf[p][l], ca)
    desc = {ca: "%s HCA-1" % host for p in cas for l in p for ca, host in l}
    for sw in cores + [a for p in aggs for a in p] + [x for p in leaf for x in p]:
        lines.append('Switch\t36 "%s"\t\t# "Quantum Mellanox Technologies" base port 0 lid 1 lmc 0' % sw)
        for n, peer in enumerate(ports[sw], 1):
            back = ports[peer].index(sw) + 1
            lines.append('[%d]\t"%s"[%d]\t\t# "%s" lid 2 4xHDR' % (n, peer, back, desc.get(peer, "sw")))
        lines.append("")
    for ca, host in desc.items():
        lines.append('Ca\t1 "%s"\t\t# "%s"' % (ca, desc[ca]))
        peer = ports[ca][0]
        lines.append('[1](%s)\t"%s"[%d]\t\t# lid 2 lmc 0 "sw" lid 1 4xHDR' % (ca[2:], peer, ports[peer].index(ca) + 1))
        lines.append("")
    return "\n".join(lines)


# -- topology/tree ----------------------------------------------------------------------------
def test_fat_tree_becomes_one_rooted_tree_through_one_aggregation_per_pod():
    topo = Topology()
    topo.fabrics.append(ibnetdiscover.parse(fat_tree_text()))
    trees = topo.trees()
    assert len(trees) == 1
    tree = trees[0]
    assert tree.tier[tree.root] == 3
    assert len(tree.all_hosts()) == 8
    assert sorted(len(tree.children[a]) for a in tree.children[tree.root]) == [2, 2]  # pods
    text = slurm_out.write_tree(topo)
    # Loaded back, the written file gives the same hosts under the same leaves.
    again = slurm_conf.parse_conf(text)
    assert {h for t in again.trees() for h in t.all_hosts()} == set(tree.all_hosts())
    assert sorted(map(sorted, again.trees()[0].hosts.values())) == sorted(map(sorted, tree.hosts.values()))


def test_tree_output_is_deterministic_whatever_the_line_order():
    text = fat_tree_text(pods=3, leaves=3, hosts=3)
    sections = text.split("\n\n")
    shuffled = list(sections)
    random.Random(7).shuffle(shuffled)
    outputs = set()
    for variant in (text, "\n\n".join(shuffled)):
        topo = Topology()
        topo.fabrics.append(ibnetdiscover.parse(variant, "fabric.txt"))
        outputs.add(slurm_out.write_tree(topo))
    assert len(outputs) == 1


def test_unconnected_fabrics_keep_their_own_roots():
    topo = sources.load_all([("ibnetdiscover", sample("ibnetdiscover/ibm-2node-mt43132-sdr.txt")),
                             ("ibnetdiscover", sample("ibnetdiscover/sun-dcs36-qdr-1node.txt"))])
    text = slurm_out.write_tree(topo)
    lines = [line for line in text.splitlines() if line.startswith("SwitchName=")]
    assert lines == ["SwitchName=sw-000b8cffff0053ee Nodes=compute-00-[00-01]",
                     "SwitchName=sw-0021283a8389a0a0 Nodes=nsn33-43"]


@pytest.mark.parametrize("name", ["nstda-tara-tree-2level-with-root.txt", "synthetic-slurm-testsuite-disconnected-trunks.txt",
                                  "synthetic-slurm-testsuite-large-4level-tree.txt",
                                  "generated-topograph-tree-oci-sim-3tier.txt"])
def test_topology_conf_round_trip(name):
    topo = slurm_conf.read(sample("topology-conf/" + name))
    again = slurm_conf.parse_conf(slurm_out.write_tree(topo))
    def shape(t):
        return sorted((tr.root, sorted((k, tuple(v)) for k, v in tr.children.items()),
                       sorted((k, tuple(v)) for k, v in tr.hosts.items())) for tr in t.trees())
    assert shape(again) == shape(topo)


# -- topology/block ------------------------------------------------------------------------------
def _blocks(sizes):
    topo = Topology()
    for b, count in enumerate(sizes):
        for h in range(count):
            topo.add_domain_host("b%dn%02d" % (b, h), "uuid-%d" % b, b)
    return topo


def test_block_sizes_default_base_times_powers_of_two():
    topo = _blocks([18, 18, 18, 18])
    text = slurm_out.write_block(topo)
    assert text.splitlines()[-1] == "BlockSizes=18,36,72"
    assert "BlockName=nvl-uuid0-0 Nodes=b0n[00-17]" in text


@pytest.mark.parametrize("sizes, message", [
    ([4, 12], "not the base 4 times a power of two"),
    ([8, 8], "must increase"),
    ([16], "fewer nodes than the base"),
    ([0], "positive"),
])
def test_block_sizes_rule_violations(sizes, message):
    with pytest.raises(TopologyError, match=message):
        slurm_out.write_block(_blocks([8, 8]), sizes)


def test_block_sizes_accepted():
    assert slurm_out.write_block(_blocks([8, 8]), [4, 8, 16]).endswith("BlockSizes=4,8,16\n")


def test_block_file_round_trip_from_samples():
    topo = slurm_conf.read(sample("topology-conf/generated-topograph-block-nvl-racks-blocksizes-8-16-32.txt"))
    text = slurm_out.write_block(topo)
    again = slurm_conf.parse_conf(text)
    assert sorted(sorted(d.hosts) for d in again.domains.values()) == \
        sorted(sorted(d.hosts) for d in topo.domains.values())
    assert again.block_sizes == [8, 16, 32]


def test_nvlink_domains_never_keyed_on_clique_alone():
    topo = Topology()
    for host, uuid in (("a1", "rackA"), ("a2", "rackA"), ("b1", "rackB"), ("b2", "rackB")):
        topo.add_domain_host(host, uuid, 1)  # the same clique id in both racks
    assert len(slurm_out.blocks(topo)) == 2


def test_no_domains_is_an_error_saying_what_to_pass():
    with pytest.raises(TopologyError, match="--fabric-info"):
        slurm_out.write_block(Topology())


# -- topology.yaml ---------------------------------------------------------------------------------
def test_yaml_round_trip_tree_and_block():
    topo = slurm_conf.read(sample("topology-conf/synthetic-slurm-25.05-manpage-topology.yaml-example.txt"))
    text = slurm_out.write_yaml(topo)
    assert text == slurm_out.write_yaml(slurm_conf.parse_yaml(text))
    again = slurm_conf.parse_yaml(text)
    assert [t.root for t in again.trees()] == ["sw_root"] and again.block_sizes == [4, 16]
    assert len(again.domains) == 4


# -- NCCL topology XML ---------------------------------------------------------------------------
XMLS = ["aws-p4d-24xlarge-a100-efa-topo.xml.txt", "azure-ndv5-h100-8gpu-8ib-topo.xml.txt",
        "rccl-mi300x-8gpu-xgmi-8nic-baremetal-topo_8p_940.xml.txt"]


@pytest.mark.parametrize("name", XMLS)
def test_nccl_xml_rewrite_keeps_gpu_nic_pairing(name):
    original = nccl_xml.parse(read("nccl-topo-xml/" + name))
    again = nccl_xml.parse(nccl_xml.to_xml(original))
    assert nccl_xml.nearest_nic_busids(again) == nccl_xml.nearest_nic_busids(original)
    assert again.link_counts() == original.link_counts()
    assert again.xml_version == original.xml_version


@pytest.mark.parametrize("name", XMLS)
def test_nccl_xml_synthesized_from_levels_gives_the_samples_pairing(name):
    """A node known only by bus ids and levels (as NVML + sysfs give them) is written with
    synthetic PCIe switches; NCCL then pairs GPUs and NICs as the real file does."""
    original = nccl_xml.parse(read("nccl-topo-xml/" + name))
    bare = NodeTopology("n1")
    bare.gpus = [Gpu(g.index, g.name, g.busid, g.numa, vendor=g.vendor) for g in original.gpus]
    bare.nics = [Nic(n.name, n.busid, n.node_guid, [NicPort(1)]) for n in original.nics]
    bare.gpu_nic = dict(original.gpu_nic)
    bare.gpu_links = dict(original.gpu_links)
    written = nccl_xml.to_xml(bare)
    assert "ffff:ff:01.0" in written
    again = nccl_xml.parse(written)
    assert nccl_xml.nearest_nic_busids(again) == nccl_xml.nearest_nic_busids(original)
    assert again.link_counts() == original.link_counts()
    assert again.xml_version == ("2" if "rccl" in name else "1")


def test_nccl_xml_needs_bus_ids():
    node = nvidia_smi.parse_topo_matrix(read("nvidia-smi-topo/rtx6000ada-4gpu-pcie-only-4nic-2socket.txt"))
    with pytest.raises(TopologyError, match="no PCI bus id for GPU0"):
        nccl_xml.to_xml(node)


def test_nccl_xml_is_deterministic():
    node = nccl_xml.parse(read("nccl-topo-xml/" + XMLS[1]))
    assert nccl_xml.to_xml(node) == nccl_xml.to_xml(nccl_xml.parse(read("nccl-topo-xml/" + XMLS[1])))


# -- NCCL hints ------------------------------------------------------------------------------------
def _rtx_with_ibstat():
    topo = sources.load_all([
        ("ibstat", "n1=" + sample("ibstat/ibstat-8hca-cx5-mixed-ib-multi-subnet-plus-ethernet.txt")),
        ("nvidia-smi-topo", "n1=" + sample("nvidia-smi-topo/rtx6000ada-4gpu-pcie-only-4nic-2socket.txt"))])
    return topo.nodes["n1"]


def test_hints_exact_nearest_hcas_per_gpu_set():
    node = _rtx_with_ibstat()
    assert nccl_hints.step_hints(node, [0])["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    env = nccl_hints.step_hints(node, [2, 3])
    assert env["NCCL_IB_HCA"] == "=mlx5_2:1,mlx5_3:1"
    assert "NCCL_CROSS_NIC" not in env  # mlx5_2 is IB (SM lid 10), mlx5_3 is Ethernet


def test_hints_cross_nic_off_across_ib_subnets():
    node = _rtx_with_ibstat()
    # mlx5_0 (SM lid 10) and mlx5_1 (SM lid 43) are on different subnets: rings must not cross.
    assert nccl_hints.step_hints(node, [0, 1])["NCCL_CROSS_NIC"] == "0"


def test_hints_roce_v2_gid_index_and_netdev():
    node = NodeTopology("n1")
    node.gpus = [Gpu(0, busid="0000:07:00.0")]
    port = NicPort(1, "Active", "Ethernet", gids=[(0, "fe80:0000:0000:0000:526b:4bff:fef9:fa6b", "RoCE v1"),
                                                   (1, "fe80:0000:0000:0000:526b:4bff:fef9:fa6b", "RoCE v2"),
                                                   (2, "0000:0000:0000:0000:0000:ffff:0a00:0005", "RoCE v1"),
                                                   (3, "0000:0000:0000:0000:0000:ffff:0a00:0005", "RoCE v2")])
    node.nics = [Nic("mlx5_0", "0000:08:00.0", ports=[port], netdev="ens1f0np0")]
    node.gpu_nic[("GPU0", "mlx5_0")] = "PIX"
    env = nccl_hints.step_hints(node)
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_SOCKET_IFNAME": "=ens1f0np0", "NCCL_IB_GID_INDEX": "3"}


def test_hints_mnnvl_only_inside_one_domain():
    topo = Topology()
    for host, uuid in (("a1", "rackA"), ("a2", "rackA"), ("b1", "rackB")):
        topo.add_domain_host(host, uuid, 7)
    node = NodeTopology("a1")
    assert nccl_hints.step_hints(node, None, ["a1", "a2"], topo.domain_of())["NCCL_MNNVL_ENABLE"] == "1"
    assert nccl_hints.step_hints(node, None, ["a1", "b1"], topo.domain_of())["NCCL_MNNVL_ENABLE"] == "0"
    assert "NCCL_MNNVL_ENABLE" not in nccl_hints.step_hints(node, None, ["a1"], topo.domain_of())


def test_hints_unknown_gpu():
    with pytest.raises(TopologyError, match="GPU 9 is not in this node"):
        nccl_hints.step_hints(_rtx_with_ibstat(), [9])


def test_hints_against_rccl_sample_pairing():
    node = nccl_xml.parse(read("nccl-topo-xml/rccl-mi300x-8gpu-xgmi-8nic-baremetal-topo_8p_940.xml.txt"))
    for index in range(8):
        assert nccl_hints.step_hints(node, [index])["NCCL_IB_HCA"] == "=mlx5_%d:1" % index


# -- placement --------------------------------------------------------------------------------
OCI = "topology-conf/generated-topograph-tree-oci-sim-3tier.txt"


def _oci():
    return slurm_conf.read(sample(OCI))


def test_place_prefers_one_leaf_tightest_fit():
    topo = _oci()
    free = ["srv%d" % n for n in list(range(1101, 1109)) + list(range(1201, 1205))]
    result = place.place(topo, 3, free)
    assert result.rule == "leaf" and result.hosts == ["srv1201", "srv1202", "srv1203"]
    assert result.score == 100 and "--switches=1" in result.slurm_options


def test_place_prefers_nvlink_domain_over_spine_crossing():
    topo = _oci()
    for n in (1105, 1106, 1107, 1108, 1201, 1202, 1203, 1204):
        topo.add_domain_host("srv%d" % n, "nvl72-a", 1)
    free = ["srv%d" % n for n in (1101, 1105, 1106, 1201, 1202, 1203, 1204, 2101, 2102)]  # no leaf has 6
    result = place.place(topo, 6, free)
    assert result.rule == "nvlink-domain"
    assert set(result.hosts) <= {"srv1105", "srv1106", "srv1107", "srv1108", "srv1201", "srv1202", "srv1203",
                                 "srv1204"}
    assert result.domains == ["nvl72-a/1"] and "--segment=6" in result.slurm_options


def test_place_fewest_spine_crossings():
    topo = _oci()
    free = ["srv%d" % n for n in (1101, 1102, 1201, 1202, 1203, 2101, 2102, 2103, 2104)]
    result = place.place(topo, 6, free)
    # switch.2.1 (pod 1) holds only 5, so switch.3.1 is needed; fullest leaves first: all of
    # switch.1.3 (2101-2104), then two of switch.1.2 (1201-1203).
    assert result.rule == "subtree" and result.common_switch == "switch.3.1" and result.tiers_crossed == 2
    assert result.hosts == ["srv1201", "srv1202", "srv2101", "srv2102", "srv2103", "srv2104"]
    assert result.leaves == ["switch.1.2", "switch.1.3"] and result.score == 78
    small = place.place(topo, 4, ["srv1101", "srv1102", "srv1201", "srv1202", "srv2101"])
    assert small.common_switch == "switch.2.1" and small.tiers_crossed == 1 and small.score == 88


def test_place_not_enough_nodes():
    with pytest.raises(TopologyError, match="only 2 free node"):
        place.place(_oci(), 3, ["srv1101", "srv1102"])


def test_place_gpus_per_node_filter():
    topo = _oci()
    topo.nodes["srv1101"] = NodeTopology("srv1101")
    topo.nodes["srv1101"].gpus = [Gpu(0)]
    result = place.place(topo, 1, ["srv1101", "srv1102"], gpus_per_node=2)
    assert result.hosts == ["srv1102"]


# -- override --------------------------------------------------------------------------------
def test_override_maps_guids_domains_and_exclusions():
    topo = sources.load_all([("ibnetdiscover", sample("ibnetdiscover/manpage-voltaire-isr9024-sdr-small.txt"))])
    ov = override.parse("guid_hosts: {'0x0008f10403960558': nodeA, '0x0008f10403960984': nodeB}\n"
                        "nvlink_domains: [{name: rack1, hosts: 'nodeA,nodeB'}]\nexclude_hosts: nodeB\n")
    override.apply(topo, ov)
    assert list(topo.fabrics[0].hosts()) == ["nodeA"]
    assert "Nodes=nodeA" in slurm_out.write_tree(topo)


def test_override_unknown_key():
    with pytest.raises(TopologyError, match="frobnicate"):
        override.parse("frobnicate: 1\n")


# -- what the sandbox gets ------------------------------------------------------------------------
def _site(tmp_path, node="n1", mode=0o644):
    site = tmp_path / "site.yaml"
    site.write_text("cluster: x\n")
    node_dir = tmp_path / "topology" / node
    node_dir.mkdir(parents=True)
    target = node_dir / sandbox_hints.FILE_NAME
    target.write_text(nccl_xml.to_xml(nccl_xml.parse(read("nccl-topo-xml/" + XMLS[2]))))
    os.chmod(target, mode)
    return str(site), str(target)


def test_sandbox_hints_mount_and_variables_for_the_steps_gpus(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the hints file must be owned by root")
    site, target = _site(tmp_path)
    mounts, env = sandbox_hints.for_step(site, "n1", {"SLURM_STEP_GPUS": "2,3"})
    assert [(m.source, m.destination, m.read_only) for m in mounts] == [(target, sandbox_hints.TOPO_MOUNT, True)]
    assert env == {"NCCL_TOPO_FILE": sandbox_hints.TOPO_MOUNT, "NCCL_IB_HCA": "=mlx5_2:1,mlx5_3:1"}
    # The step's own settings win; other nodes have no file.
    _, env = sandbox_hints.for_step(site, "n1", {"NCCL_IB_HCA": "=mine"})
    assert "NCCL_IB_HCA" not in env
    assert sandbox_hints.for_step(site, "n2", {}) == ([], {})


def test_sandbox_hints_ignore_a_file_others_can_write(tmp_path, capsys):
    site, target = _site(tmp_path, mode=0o666)
    assert sandbox_hints.for_step(site, "n1", {}) == ([], {})
    assert "ignoring %s" % target in capsys.readouterr().err


# -- hostlist compression -----------------------------------------------------------------------
from hypothesis import given, settings, strategies as st  # noqa: E402

from slurmbox.topology import hostlists  # noqa: E402

_names = st.builds(lambda prefix, number, pad: "%s%0*d" % (prefix, pad, number),
                   st.sampled_from(["n", "gpu", "r1n", "tara-c-", "sw.1.", "x"]),
                   st.integers(min_value=0, max_value=300), st.integers(min_value=0, max_value=4))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_names, st.sampled_from(["login", "master", "dgx-a"])), min_size=1, max_size=40))
def test_compress_expands_back_to_the_same_names(names):
    text = hostlists.compress(names)
    assert sorted(hostlists.expand(text)) == sorted(set(names))
    assert hostlists.compress(reversed(names)) == text  # order of input does not matter


def test_compress_examples():
    assert hostlists.compress(["gpu%05d" % i for i in range(1, 16385)]) == "gpu[00001-16384]"
    assert hostlists.compress(["n9", "n10", "n1"]) == "n[1,9-10]"
    assert hostlists.compress(["switch.1.9", "switch.1.10"]) == "switch.1.[9-10]"


def test_sandbox_hints_destination_follows_image_and_user_mounts(tmp_path, capsys):
    from types import SimpleNamespace

    from slurmbox.sandbox.options import Mount
    host_root = SimpleNamespace(image=None, mounts=[Mount("/home/u/data", "/data", False)])
    image = SimpleNamespace(image="/images/ubuntu", mounts=[])
    over_run = SimpleNamespace(image=None, mounts=[Mount("/home/u/run", "/run", False)])
    over_root = SimpleNamespace(image="/images/ubuntu", mounts=[Mount("/home/u/fs", "/", False)])
    assert sandbox_hints.destination(host_root) == sandbox_hints.TOPO_MOUNT == "/run/nccl-topo.xml"
    assert sandbox_hints.destination(image) == sandbox_hints.IMAGE_TOPO_MOUNT == "/tmp/nccl-topo.xml"
    assert sandbox_hints.destination(over_run) is None and sandbox_hints.destination(over_root) is None
    if os.geteuid() == 0:
        site, _ = _site(tmp_path)
        mounts, env = sandbox_hints.for_step(site, "n1", {}, image)
        assert mounts[0].destination == "/tmp/nccl-topo.xml" and env["NCCL_TOPO_FILE"] == "/tmp/nccl-topo.xml"
        assert sandbox_hints.for_step(site, "n1", {}, over_run) == ([], {})
        assert "not mounted: the step mounts its own directory over /run" in capsys.readouterr().err
