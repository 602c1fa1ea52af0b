"""Every recorded real (and labelled synthetic) sample loads into the topology model with the
counts read off the files by hand.

Samples live in tests/data/topology/ (copies of ../shared/samples/ with their SOURCES.md),
so a fresh clone can run these tests.
"""

import filecmp
import os

import pytest

from slurmbox.topology import amd, ibnetdiscover, ibstat, nccl_xml, nvidia_smi, slurm_conf, sources
from slurmbox.topology.model import Topology, TopologyError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "tests", "data", "topology")
SHARED = os.path.join(REPO, "..", "shared", "samples")


def sample(path):
    return os.path.join(DATA, path)


def text(path):
    with open(sample(path), encoding="utf-8") as handle:
        return handle.read()


def test_copies_match_the_shared_samples():
    if not os.path.isdir(SHARED):
        pytest.skip("../shared/samples is absent (fresh clone): only the copies in tests/data/topology are used")
    compared = 0
    for folder, _, files in os.walk(SHARED):
        for name in files:
            original = os.path.join(folder, name)
            copy = os.path.join(DATA, os.path.relpath(original, SHARED))
            assert os.path.exists(copy), "sample %s was not copied into tests/data/topology" % original
            assert filecmp.cmp(original, copy, shallow=False), "%s differs from its shared original" % copy
            compared += 1
    assert compared >= 28


# -- ibnetdiscover ---------------------------------------------------------------------------
def _counts(fabric):
    return (len(fabric.switches()), len(fabric.cas()), len(fabric.hosts()), len(fabric.links))


def test_ibnetdiscover_ufm_lab_noise_loopbacks_mixed_speeds():
    fabric = ibnetdiscover.read(sample("ibnetdiscover/ufm-lab-switchib-edr-sx6012-fdr-mixed-loopback.txt"))
    # 2 switches; 6 HCAs; hosts r-ufm216, r-ufm111, r-ufm101 (2 HCAs), r-ufm100, r-ufm96;
    # links: 3 loopbacks on the SwitchIB (1-2, 19-21, 29-30), 1 switch-switch, 6 switch-HCA.
    assert _counts(fabric) == (2, 6, 5, 10)
    assert sum(1 for lk in fabric.links if lk.loopback) == 3
    assert fabric.hosts()["r-ufm101"] == ["H-0002c9030004e938", "H-0002c9030006ba5a"]
    assert any("skipped 1 line" in w for w in fabric.warnings)  # the umad stderr line
    speeds = sorted({lk.speed for lk in fabric.links})
    assert speeds == ["EDR", "FDR", "QDR", "SDR"]
    inter = [lk for lk in fabric.links if lk.a.startswith("S-") and lk.b.startswith("S-") and not lk.loopback]
    assert len(inter) == 1 and inter[0].rate_gbps == 56.0  # 4xFDR
    trees = fabric.trees()
    assert len(trees) == 1  # one connected fabric, one root; loopbacks do not make tiers
    assert trees[0].all_hosts() == ["r-ufm100", "r-ufm101", "r-ufm111", "r-ufm216", "r-ufm96"]


def test_ibnetdiscover_manpage_voltaire_needs_guid_fallback():
    fabric = ibnetdiscover.read(sample("ibnetdiscover/manpage-voltaire-isr9024-sdr-small.txt"))
    # ISR9024 + SW-6IB4; 4 InfiniHost CAs whose descriptions name no host;
    # links: 2 between the switches, 3 CA links on the ISR9024 (one CA has two), 2 on the SW-6IB4.
    assert _counts(fabric) == (2, 4, 0, 7)
    assert len(fabric.unmapped_cas()) == 4
    # "Non-Chassis Nodes" is a known header, not noise. The man page example prints two
    # links as 4x from the ISR9024 and 1x from the other end: the slower reading is kept.
    assert fabric.warnings == ["2 link(s) read differently from their two ends; kept the slower"]
    widths = sorted(lk.width for lk in fabric.links)
    assert widths.count("1x") == 2 and widths.count("4x") == 5
    with pytest.raises(TopologyError, match="no switch with a host"):
        from slurmbox.topology import slurm_out
        topo = Topology()
        topo.fabrics.append(fabric)
        slurm_out.write_tree(topo)
    # GUID fallback: a node's ibstat gives its HCA's Node GUID (synthetic ibstat for this test).
    nics = ibstat.parse_ibstat("CA 'mlx4_0'\n\tCA type: MT23108\n\tNode GUID: 0x0008f10403960558\n"
                               "\tPort 1:\n\t\tState: Active\n\t\tLink layer: InfiniBand\n")
    assert fabric.map_guids(ibstat.guid_map(nics, "nodeA")) == 1
    assert fabric.hosts() == {"nodeA": ["H-0008f10403960558"]}


def test_ibnetdiscover_ibm_and_sun_are_two_subnets_never_joined():
    ibm = ibnetdiscover.read(sample("ibnetdiscover/ibm-2node-mt43132-sdr.txt"))
    sun = ibnetdiscover.read(sample("ibnetdiscover/sun-dcs36-qdr-1node.txt"))
    assert _counts(ibm) == (1, 2, 2, 2)
    assert sorted(ibm.hosts()) == ["compute-00-00", "compute-00-01"]
    assert _counts(sun) == (1, 1, 1, 1)  # the blank line holding one space separates sections
    assert list(sun.hosts()) == ["nsn33-43"]
    topo = Topology()
    topo.fabrics += [ibm, sun]
    trees = topo.trees()
    assert [t.root for t in trees] == ["S-000b8cffff0053ee", "S-0021283a8389a0a0"]


def test_ibnetdiscover_skips_sharp_aggregation_nodes_and_noise():
    text_ = (
        "ibwarn: [1234] mad_rpc: _do_madrpc failed; dport (DR path slid 0; dlid 0; 0,1)\n"
        "vendid=0x2c9\ndevid=0xd2f0\nswitchguid=0xb83fd203007a1b20(b83fd203007a1b20)\n"
        'Switch\t41 "S-b83fd203007a1b20"\t\t# "MF0;leaf1:MQM8700/U1" enhanced port 0 lid 3 lmc 0\n'
        '[1]\t"H-b83fd203007a1b28"[1](b83fd203007a1b28) \t\t# "Mellanox Technologies Aggregation Node" lid 4 4xHDR\n'
        '[5]\t"H-0c42a10300112230"[1](c42a10300112230) \t\t# "gpu001 mlx5_0" lid 7 4xHDR\n'
        "\n"
        "vendid=0x2c9\ndevid=0xcf09\ncaguid=0xb83fd203007a1b28\n"
        'Ca\t1 "H-b83fd203007a1b28"\t\t# "Mellanox Technologies Aggregation Node"\n'
        '[1](b83fd203007a1b28) \t"S-b83fd203007a1b20"[1]\t\t# lid 4 lmc 0 "MF0;leaf1:MQM8700/U1" lid 3 4xHDR\n'
        "\n"
        "vendid=0x2c9\ndevid=0x101b\ncaguid=0xc42a10300112230\n"
        'Ca\t1 "H-0c42a10300112230"\t\t# "gpu001 mlx5_0"\n'
        '[1](c42a10300112230) \t"S-b83fd203007a1b20"[5]\t\t# lid 7 lmc 0 "MF0;leaf1:MQM8700/U1" lid 3 4xHDR\n')
    fabric = ibnetdiscover.parse(text_, "sharp")
    assert _counts(fabric) == (1, 1, 1, 1)
    assert fabric.links[0].rate_gbps == 200.0
    assert any("SHARP" in w for w in fabric.warnings)


def test_ibnetdiscover_rejects_other_text():
    with pytest.raises(TopologyError, match="ibnetdiscover"):
        ibnetdiscover.parse("hello\nworld\n")


# -- ibstat / ibv_devinfo ---------------------------------------------------------------------
def test_ibstat_eight_cx5_multi_subnet_plus_ethernet():
    nics = ibstat.parse(text("ibstat/ibstat-8hca-cx5-mixed-ib-multi-subnet-plus-ethernet.txt"))
    assert [n.name for n in nics] == ["mlx4_0"] + ["mlx5_%d" % i for i in range(8)]
    layers = [n.link_layer for n in nics]
    assert layers.count("Ethernet") == 2 and layers.count("InfiniBand") == 7
    assert [n.name for n in nics if n.link_layer == "Ethernet"] == ["mlx4_0", "mlx5_3"]
    assert ibstat.subnets(nics) == {10: ["mlx5_0", "mlx5_2", "mlx5_4", "mlx5_6"], 43: ["mlx5_1", "mlx5_7"],
                                    344: ["mlx5_5"]}
    rates = sorted(n.ports[0].rate_gbps for n in nics if n.link_layer == "InfiniBand")
    assert rates == [56.0, 56.0, 56.0, 100.0, 100.0, 100.0, 100.0]
    assert nics[1].node_guid == 0x506b4b0300f9f8ea and nics[1].ports[0].lid == 59


def test_ibstat_initializing_port_and_stray_line():
    nics = ibstat.parse(text("ibstat/ibstat-cx3-port-initializing-no-sm.txt"))
    assert len(nics) == 1 and len(nics[0].ports) == 1
    port = nics[0].ports[0]
    assert (port.state, port.lid, port.sm_lid, port.rate_gbps) == ("Initializing", 0, 0, 40.0)
    assert ibstat.subnets(nics) == {}


def test_ibv_devinfo_text():
    # Layout of ibv_devinfo(1) output (ibverbs-utils 44); values written for this test.
    out = ("hca_id:\tmlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n\tnode_guid:\t\t\t506b:4b03:00f9:f8ea\n"
           "\tvendor_part_id:\t\t\t4119\n\tphys_port_cnt:\t\t\t1\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"
           "\t\t\tsm_lid:\t\t\t10\n\t\t\tport_lid:\t\t59\n\t\t\tlink_layer:\t\tInfiniBand\n\n"
           "hca_id:\tmlx5_1\n\tnode_guid:\t\t\t506b:4b03:00f9:f8eb\n\t\tport:\t1\n"
           "\t\t\tstate:\t\t\tPORT_DOWN (1)\n\t\t\tlink_layer:\t\tEthernet\n")
    nics = ibstat.parse(out)
    assert [(n.name, n.node_guid, n.ports[0].state, n.link_layer) for n in nics] == [
        ("mlx5_0", 0x506b4b0300f9f8ea, "Active", "InfiniBand"), ("mlx5_1", 0x506b4b0300f9f8eb, "Down", "Ethernet")]
    assert nics[0].ports[0].lid == 59 and nics[0].ca_type == "MT4119"


# -- nvidia-smi topo ----------------------------------------------------------------------------
@pytest.mark.parametrize("name, gpus, counts", [
    ("2gpu-nv2-consumer-no-legend.txt", 2, {"NV2": 1}),
    ("a100-8gpu-nv12-dgx-like-no-nics-respaced.txt", 8, {"NV12": 28}),
    ("h100-8gpu-nv18-no-nics-hyperthreads.txt", 8, {"NV18": 28}),
    ("rtx6000ada-4gpu-pcie-only-4nic-2socket.txt", 4, {"NODE": 2, "SYS": 4}),
])
def test_nvidia_smi_topo_samples(name, gpus, counts):
    node = nvidia_smi.parse_topo_matrix(text("nvidia-smi-topo/" + name))
    assert len(node.gpus) == gpus
    assert node.link_counts() == counts


def test_nvidia_smi_topo_nics_legend_numa_affinity():
    node = nvidia_smi.parse_topo_matrix(text("nvidia-smi-topo/rtx6000ada-4gpu-pcie-only-4nic-2socket.txt"))
    assert [n.name for n in node.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert len(node.gpu_nic) == 16
    assert sorted(node.gpu_nic.values()).count("NODE") == 8 and sorted(node.gpu_nic.values()).count("SYS") == 8
    assert node.nearest_nics("GPU0") == ["mlx5_0", "mlx5_1"]
    assert node.nearest_nics("GPU3") == ["mlx5_2", "mlx5_3"]
    assert [g.numa for g in node.gpus] == [0, 0, 1, 1]
    h100 = nvidia_smi.parse_topo_matrix(text("nvidia-smi-topo/h100-8gpu-nv18-no-nics-hyperthreads.txt"))
    assert h100.gpus[4].cpu_affinity == "52-103,156-207" and h100.gpus[4].numa == 1
    assert [sorted(i) for i in h100.nvlink_islands()] == [["GPU%d" % i for i in range(8)]]


def test_nvidia_smi_topo_with_ansi_colours_and_soc():
    coloured = ("\x1b[4mGPU0\tGPU1\tCPU Affinity\x1b[0m\n"
                "GPU0\t X \t\x1b[32mSOC\x1b[0m\t0-7\n"
                "GPU1\t\x1b[32mSOC\x1b[0m\t X \t8-15\n")
    node = nvidia_smi.parse_topo_matrix(coloured)
    assert node.link_counts() == {"SYS": 1}


def test_nvidia_smi_p2p_read_all_ok():
    node = nvidia_smi.parse_p2p(text("other/nvidia-smi-topo-p2p-read-8gpu-ok.txt"))
    assert len(node.gpus) == 8 and len(node.p2p) == 28 and set(node.p2p.values()) == {"OK"}


# -- AMD --------------------------------------------------------------------------------------
def test_rocm_smi_mi300a_uses_link_type_not_hops():
    node = amd.parse(text("amd-topo/mi300a-4apu-rocm-smi-showtopo.txt"))
    assert len(node.gpus) == 4 and node.link_counts() == {"XGMI": 6}
    assert set(node.gpu_weights.values()) == {15}
    assert [g.numa for g in node.gpus] == [0, 1, 2, 3]
    assert [sorted(h) for h in node.xgmi_hives()] == [["GPU0", "GPU1", "GPU2", "GPU3"]]


def test_amd_smi_tables_mi300x():
    node = amd.parse(text("amd-topo/mi300x-8gpu-amd-smi-topology-tables.txt"))
    assert [g.busid for g in node.gpus] == ["0000:0c:00.0", "0000:22:00.0", "0000:38:00.0", "0000:5c:00.0",
                                           "0000:9f:00.0", "0000:af:00.0", "0000:bf:00.0", "0000:df:00.0"]
    assert node.link_counts() == {"XGMI": 28} and len(node.gpu_weights) == 28
    assert len(node.xgmi_hives()) == 1


def test_amd_smi_json_excerpt_with_elisions():
    node = amd.parse(text("amd-topo/amd-smi-topology-json-schema-excerpt.txt"))
    assert [g.busid for g in node.gpus] == ["0000:01:00.0", "0001:01:00.0"]
    assert node.link_counts() == {"XGMI": 1} and node.gpu_weights == {("GPU0", "GPU1"): 15}


def test_amd_pcie_pairs_use_numa_not_hops():
    out = ("====== Weight between two GPUs ======\n       GPU0  GPU1  GPU2\nGPU0   0     40    72\n"
           "GPU1   40    0     72\nGPU2   72    72    0\n\n"
           "====== Link Type between two GPUs ======\n       GPU0  GPU1  GPU2\nGPU0   0     PCIE  PCIE\n"
           "GPU1   PCIE  0     PCIE\nGPU2   PCIE  PCIE  0\n\n"
           "GPU[0]\t\t: (Topology) Numa Node: 0\nGPU[1]\t\t: (Topology) Numa Node: 0\n"
           "GPU[2]\t\t: (Topology) Numa Node: 1\n")
    node = amd.parse(out)
    assert node.link(("GPU0"), "GPU1") == "NODE" and node.link("GPU0", "GPU2") == "SYS"
    assert node.xgmi_hives() == []


# -- NCCL topology XML ---------------------------------------------------------------------------
def test_nccl_xml_aws_p4d_gpu_nic_pairs_share_a_switch():
    node = nccl_xml.parse(text("nccl-topo-xml/aws-p4d-24xlarge-a100-efa-topo.xml.txt"))
    assert (len(node.gpus), len(node.nics), node.xml_version) == (8, 4, "1")
    assert sorted(node.gpu_nic.values()).count("PIX") == 8  # 2 GPUs per NIC
    assert node.nearest_nics("GPU0") == ["NIC0"] and node.nearest_nics("GPU7") == ["NIC3"]
    assert node.gpu_nic[("GPU0", "NIC1")] == "PHB" and node.gpu_nic[("GPU0", "NIC2")] == "SYS"
    assert node.link_counts() == {}


def test_nccl_xml_azure_ndv5_one_ib_vf_per_gpu():
    node = nccl_xml.parse(text("nccl-topo-xml/azure-ndv5-h100-8gpu-8ib-topo.xml.txt"))
    assert (len(node.gpus), len(node.nics)) == (8, 8)
    pairs = nccl_xml.nearest_nic_busids(node)
    assert pairs["0001:00:00.0"] == ["0101:00:00.0"] and pairs["000c:00:00.0"] == ["0108:00:00.0"]
    assert all(len(v) == 1 for v in pairs.values())


def test_nccl_xml_rccl_mi300x_xgmi_and_named_nics():
    node = nccl_xml.parse(text("nccl-topo-xml/rccl-mi300x-8gpu-xgmi-8nic-baremetal-topo_8p_940.xml.txt"))
    assert (len(node.gpus), len(node.nics), node.xml_version) == (8, 8, "2")
    assert node.link_counts() == {"XGMI": 28}
    assert [n.name for n in node.nics] == ["mlx5_%d" % i for i in range(8)]
    assert node.nearest_nics("GPU0") == ["mlx5_0"] and node.gpu_nic[("GPU0", "mlx5_0")] == "PXB"
    assert node.nics[0].node_guid == 0xf01cbc0103dd6838 and node.nics[0].speed_mbps == 400000


# -- Slurm topology files -----------------------------------------------------------------------
@pytest.mark.parametrize("name, switches, hosts, roots", [
    ("nstda-tara-tree-2level-with-root.txt", 5, 10, ["s4"]),
    ("bnl-nsls2-puppet-leaves-no-root.txt", 4, 39, ["s0", "s1", "s2", "s3"]),
    ("generated-topograph-tree-oci-sim-3tier.txt", 19, 96, ["switch.3.1"]),
    ("synthetic-slurm-testsuite-disconnected-trunks.txt", 7, 40, ["leafC", "spineA", "spineB"]),
    ("synthetic-slurm-testsuite-large-4level-tree.txt", 529, 10000, ["root"]),
])
def test_topology_conf_trees(name, switches, hosts, roots):
    topo = slurm_conf.read(sample("topology-conf/" + name))
    fabric = topo.fabrics[0]
    assert len(fabric.switches()) == switches
    assert len(fabric.hosts()) == hosts
    assert [t.root for t in topo.trees()] == roots


def test_topology_conf_large_tree_tiers():
    topo = slurm_conf.read(sample("topology-conf/synthetic-slurm-testsuite-large-4level-tree.txt"))
    tree = topo.trees()[0]
    assert tree.tier["root"] == 4 and tree.tier["im0"] == 3 and tree.tier["grp10"] == 2
    assert tree.tier["leaf100"] == 1 and len(tree.hosts) == 500


@pytest.mark.parametrize("name, blocks, per_block, sizes", [
    ("synthetic-slurm-testsuite-block-blocksizes-4-64.txt", 8, 4, [4, 8, 16, 32, 64]),
    ("generated-topograph-block-nvl-racks-blocksizes-8-16-32.txt", 12, 8, [8, 16, 32]),
])
def test_topology_conf_blocks(name, blocks, per_block, sizes):
    topo = slurm_conf.read(sample("topology-conf/" + name))
    assert len(topo.domains) == blocks
    assert {len(d.hosts) for d in topo.domains.values()} == {per_block}
    assert topo.block_sizes == sizes


@pytest.mark.parametrize("name, others", [
    ("synthetic-slurm-manpage-topology.yaml-example.txt",
     ["topo3: flat", "topo3a: flat", "topo4: ring", "topo5: torus3d"]),
    ("synthetic-slurm-25.05-manpage-topology.yaml-example.txt", ["topo3: flat"]),
])
def test_topology_yaml(name, others):
    topo = slurm_conf.read(sample("topology-conf/" + name))
    assert len(topo.fabrics) == 1 and len(topo.fabrics[0].switches()) == 3
    assert sorted(topo.fabrics[0].hosts()) == ["node01", "node02", "node03", "node04"]
    assert [t.root for t in topo.trees()] == ["sw_root"]
    assert len(topo.domains) == 4 and topo.block_sizes == [4, 16]
    assert topo.other == others


def test_topology_conf_bad_line():
    with pytest.raises(TopologyError, match="expected SwitchName"):
        slurm_conf.parse_conf("Frobnicate=1\n")


# -- NetQ / NMX -------------------------------------------------------------------------------
def test_netq_topology_graph():
    topo = sources.load_all([(None, sample("other/topograph-netq-topologyGraph-test.json.txt"))])
    fabric = topo.fabrics[0]
    assert fabric.link_layer == "Ethernet"
    assert _counts(fabric) == (3, 8, 8, 10)
    assert sum(lk.count for lk in fabric.links) == 8 * 4 + 28 + 19
    tree = topo.trees()[0]
    assert fabric.nodes[tree.root].description == "net-unit-s1"
    assert tree.hosts == {"node0": ["dgx-01", "dgx-02", "dgx-03", "dgx-04"],
                          "node9": ["dgx-05", "dgx-06", "dgx-07", "dgx-08"]}


def test_nmx_compute_nodes_are_one_nvlink_domain():
    topo = sources.load_all([(None, sample("other/topograph-netq-nmx-computeNodes-test.json.txt"))])
    assert len(topo.domains) == 1
    domain = list(topo.domains.values())[0]
    assert domain.cluster_uuid == "3fbfc98b-7f95-4749-ab11-bd351a2aab3e" and domain.hosts == {"node1", "node2"}


def test_fabric_info_keys_on_cluster_uuid_and_clique_together():
    info = ("- {host: a1, cluster_uuid: rack-A, clique_id: 1}\n- {host: a2, cluster_uuid: rack-A, clique_id: 1}\n"
            "- {host: b1, cluster_uuid: rack-B, clique_id: 1}\n")
    from slurmbox.topology import fabric_info
    topo = fabric_info.parse_fabric_info(info)
    assert sorted(sorted(d.hosts) for d in topo.domains.values()) == [["a1", "a2"], ["b1"]]


# -- host names the fabric reports are set by the hosts themselves: never hostlists -------------
def test_hca_descriptions_that_are_not_plain_host_names_name_no_host():
    raw = text("ibnetdiscover/ibm-2node-mt43132-sdr.txt")
    assert '"compute-00-01 HCA-1"' in raw
    for injected in ("compute-00-00,evil[1-9] HCA-1", "Nodes=x HCA-1", "a[1-3] HCA-1"):
        fabric = ibnetdiscover.parse(raw.replace("compute-00-01 HCA-1", injected))
        assert sorted(fabric.hosts()) == ["compute-00-00"], injected
    assert ibnetdiscover.host_from_description("gpu-001.rack2_a HCA-1") == "gpu-001.rack2_a"


def test_netq_and_fabric_info_refuse_hostlists_and_malformed_entries():
    from slurmbox.topology import fabric_info
    graph = ('{"nodes": [{"id": "s", "device_type": "switch"}, {"id": "h1", "name": "a,b[1-9]"}, '
             '{"id": "h2", "name": "dgx-01"}], "links": [{"src": "s", "target": "h1"}, {"src": "s", "target": "h2"}]}')
    fabric = fabric_info.parse_netq_graph(graph)
    assert sorted(fabric.hosts()) == ["dgx-01"] and any("a,b[1-9]" in w for w in fabric.warnings)
    for bad in ('{"nodes": [1], "links": []}', '{"nodes": [{"name": "x"}], "links": []}',
                '{"nodes": [{"id": "s"}], "links": [{"src": "s", "target": "s", "size": "x"}]}'):
        with pytest.raises(TopologyError, match="malformed NetQ"):
            fabric_info.parse_netq_graph(bad)
    with pytest.raises(TopologyError, match="not a plain host name"):
        fabric_info.parse_fabric_info("- {host: 'a,b[1-3]', cluster_uuid: u, clique_id: 1}\n")
    with pytest.raises(TopologyError, match="clique_id 'x' is not an integer"):
        fabric_info.parse_fabric_info("- {host: n1, cluster_uuid: u, clique_id: x}\n")


# -- detection: every sample file is recognised ----------------------------------------------------
EXPECTED_KIND = {"ibnetdiscover": "ibnetdiscover", "ibstat": "ibstat", "nvidia-smi-topo": "nvidia-smi-topo",
                 "amd-topo": "amd-topo", "nccl-topo-xml": "nccl-xml", "topology-conf": "topology-conf"}


def test_every_sample_is_detected_and_loads():
    loaded = 0
    for folder in sorted(os.listdir(DATA)):
        path = os.path.join(DATA, folder)
        if not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            kind = sources.detect(text(os.path.join(folder, name)))
            if folder in EXPECTED_KIND:
                assert kind == EXPECTED_KIND[folder], name
            topo = sources.load_all([(None, os.path.join(path, name))])
            assert topo.fabrics or topo.nodes or topo.domains, name
            loaded += 1
    assert loaded == 28


def test_malformed_node_guid_is_a_topology_error_naming_the_node():
    text = 'Switch\t36 "S-zz"\t\t# "sw" enhanced port 0 lid 1 lmc 0\n[1]\t"H-0c42"[1]\t\t# "n1 mlx5_0" lid 2 4xHDR\n'
    with pytest.raises(TopologyError, match='node id "S-zz" is not S-/H- followed by a hexadecimal GUID'):
        ibnetdiscover.parse(text, "bad.txt")
