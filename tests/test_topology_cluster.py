"""Generated topology through the real Slurm and the real sandbox.

One dev cluster (nodes n1, n2) boots with TopologyPlugin=topology/tree and a topology.conf
generated from ibnetdiscover text whose HCA descriptions name n1 and n2 (a spine above two
leaf switches). ``scontrol show topology`` must agree with the model, ``topology place``
must read Slurm's idle nodes, and a sandboxed step must see the node's NCCL topology XML.
Slurm 22.05 has no topology/block, so block output is checked in unit tests only.
"""

import os
import shutil
import subprocess
import uuid

import pytest

from conftest import PREFIX, Cluster, _cluster_skip_reason, _free_subnet
from slurmbox.topology import ibnetdiscover, sandbox_hints, slurm_out
from slurmbox.topology.model import Topology

SLURMBOX = os.path.join(PREFIX, "venv", "bin", "slurmbox")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "topology")
RCCL_XML = os.path.join(DATA, "nccl-topo-xml", "rccl-mi300x-8gpu-xgmi-8nic-baremetal-topo_8p_940.xml.txt")

# Written for this test in ibnetdiscover(8)'s format: spine 0x...a0 above leaves 0x...b0 (n1)
# and 0x...c0 (n2).
FABRIC = """\
#
# Topology file: written for slurmbox's dev-cluster test
#
vendid=0x2c9
devid=0xd2f0
switchguid=0x98039b03000000a0(98039b03000000a0)
Switch\t40 "S-98039b03000000a0"\t\t# "MF0;spine1:MQM8700/U1" enhanced port 0 lid 1 lmc 0
[1]\t"S-98039b03000000b0"[40]\t\t# "MF0;leaf1:MQM8700/U1" lid 2 4xHDR
[2]\t"S-98039b03000000c0"[40]\t\t# "MF0;leaf2:MQM8700/U1" lid 3 4xHDR

vendid=0x2c9
devid=0xd2f0
switchguid=0x98039b03000000b0(98039b03000000b0)
Switch\t40 "S-98039b03000000b0"\t\t# "MF0;leaf1:MQM8700/U1" enhanced port 0 lid 2 lmc 0
[1]\t"H-0c42a10300000001"[1](c42a10300000001)\t\t# "n1 mlx5_0" lid 11 4xHDR
[40]\t"S-98039b03000000a0"[1]\t\t# "MF0;spine1:MQM8700/U1" lid 1 4xHDR

vendid=0x2c9
devid=0xd2f0
switchguid=0x98039b03000000c0(98039b03000000c0)
Switch\t40 "S-98039b03000000c0"\t\t# "MF0;leaf2:MQM8700/U1" enhanced port 0 lid 3 lmc 0
[1]\t"H-0c42a10300000002"[1](c42a10300000002)\t\t# "n2 mlx5_0" lid 12 4xHDR
[40]\t"S-98039b03000000a0"[2]\t\t# "MF0;spine1:MQM8700/U1" lid 1 4xHDR

vendid=0x2c9
devid=0x101b
caguid=0x0c42a10300000001
Ca\t1 "H-0c42a10300000001"\t\t# "n1 mlx5_0"
[1](c42a10300000001)\t"S-98039b03000000b0"[1]\t\t# lid 11 lmc 0 "MF0;leaf1:MQM8700/U1" lid 2 4xHDR

vendid=0x2c9
devid=0x101b
caguid=0x0c42a10300000002
Ca\t1 "H-0c42a10300000002"\t\t# "n2 mlx5_0"
[1](c42a10300000002)\t"S-98039b03000000c0"[1]\t\t# lid 12 lmc 0 "MF0;leaf2:MQM8700/U1" lid 3 4xHDR
"""


@pytest.fixture(scope="module")
def topo_cluster(tmp_path_factory):
    reason = _cluster_skip_reason()
    if reason:
        pytest.skip(reason)
    from slurmbox.dev_cluster.cluster import DevCluster

    fabric_file = tmp_path_factory.mktemp("fabric") / "ibnetdiscover.txt"
    fabric_file.write_text(FABRIC)
    generated = subprocess.run([SLURMBOX, "topology", "generate", "--format", "tree", "--ibnetdiscover",
                                str(fabric_file)], capture_output=True, text=True, timeout=60)
    assert generated.returncode == 0, generated.stderr
    directory = "/tmp/sbxtopo-%s" % uuid.uuid4().hex[:6]
    dev = DevCluster(directory, nodes=2, gpus_per_node=2, subnet=_free_subnet(), prefix=PREFIX,
                     extra_slurm_conf="TopologyPlugin=topology/tree\n",
                     extra_files={"topology.conf": generated.stdout})
    dev.up()
    try:
        yield Cluster(dev), str(fabric_file), generated.stdout
    finally:
        dev.down()


def _model():
    topo = Topology()
    topo.fabrics.append(ibnetdiscover.parse(FABRIC, "fabric"))
    return topo


def test_generated_tree_is_what_slurm_loads(topo_cluster):
    cluster, _, text = topo_cluster
    out = cluster.run(["scontrol", "show", "topology"], user="root")
    assert out.returncode == 0, out.stderr
    from slurmbox.slurm_client.scontrol import parse_oneliner
    from slurmbox.topology.hostlists import expand
    seen = {}
    for line in out.stdout.splitlines():
        if line.startswith("SwitchName="):
            rec = parse_oneliner(line)
            switches = rec.get("Switches", "(null)")
            seen[rec["SwitchName"]] = (int(rec["Level"]), sorted(expand(rec.get("Nodes", ""))),
                                       sorted(expand(switches)) if switches != "(null)" else [])
    topo = _model()
    names = {ident: name for (_, ident), name in slurm_out.switch_names(topo).items()}
    (tree,) = topo.trees()
    expected = {}
    for sw in tree.switches():
        expected[names[sw]] = (tree.tier[sw] - 1, tree.all_hosts(sw), sorted(names[c] for c in tree.children.get(sw, [])))
    assert seen == expected
    assert seen["sw-98039b03000000a0"] == (1, ["n1", "n2"], ["sw-98039b03000000b0", "sw-98039b03000000c0"])


def test_place_reads_slurm_idle_nodes(topo_cluster):
    cluster, fabric_file, _ = topo_cluster
    cluster.wait_for(lambda: sorted(set(cluster.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], user="root")
                                        .stdout.split())) == ["n1", "n2"], timeout=120, what="both nodes idle")
    one = cluster.run([SLURMBOX, "topology", "place", "--nodes", "1", "--ibnetdiscover", fabric_file], user="root")
    assert one.returncode == 0, one.stderr
    assert "nodes: n1" in one.stdout and "score: 100/100 (leaf)" in one.stdout and "--switches=1" in one.stdout
    two = cluster.run([SLURMBOX, "topology", "place", "--nodes", "2", "--json", "--ibnetdiscover", fabric_file],
                      user="root")
    import json
    result = json.loads(two.stdout)
    assert result["hosts"] == ["n1", "n2"] and result["common_switch"] == "sw-98039b03000000a0"
    assert result["tiers_crossed"] == 1 and "--switches=2" in result["slurm_options"]
    # Slurm itself places a two-node job across the two leaves (the spine joins them).
    job = cluster.srun("-N2", "--switches=2", "hostname", timeout=120)
    assert job.returncode == 0, job.stderr
    assert sorted(job.stdout.split()) == ["n1", "n2"]


def test_sandboxed_step_sees_the_nodes_nccl_topology(topo_cluster, workdir):
    cluster, _, _ = topo_cluster
    etc = os.path.dirname(cluster.dev.site_config)
    node_dir = os.path.join(etc, "topology", "n1")
    os.makedirs(node_dir, exist_ok=True)
    os.chmod(os.path.join(etc, "topology"), 0o755)
    os.chmod(node_dir, 0o755)
    target = os.path.join(node_dir, sandbox_hints.FILE_NAME)
    gen = subprocess.run([SLURMBOX, "topology", "generate", "--format", "nccl-xml", "--nccl-xml", "n1=" + RCCL_XML,
                          "--out", target], capture_output=True, text=True, timeout=60)
    assert gen.returncode == 0, gen.stderr
    try:
        script = 'echo "file=$NCCL_TOPO_FILE"; echo "hca=$NCCL_IB_HCA"; head -1 "$NCCL_TOPO_FILE"'
        # No --gres: this runsc has no nvproxy, so GPU steps cannot run here; a step without GPUs
        # gets the NICs nearest every GPU of the node (per-GPU choice: test_topology_outputs).
        out = cluster.srun("--sandbox", "-w", "n1", "sh", "-c", script, cwd=workdir, timeout=180)
        assert out.returncode == 0, out.stderr
        assert "file=%s" % sandbox_hints.TOPO_MOUNT in out.stdout
        assert "hca==%s" % ",".join("mlx5_%d:1" % i for i in range(8)) in out.stdout
        assert '<system version="2">' in out.stdout
        # A sandboxed batch step (its own mounts for the srun broker come on top) sees it too.
        output = os.path.join(workdir, "batch.out")
        batch = cluster.run(["sbatch", "-W", "-w", "n1", "--sandbox", "-o", output, "--wrap",
                             'echo "file=$NCCL_TOPO_FILE"; head -1 "$NCCL_TOPO_FILE"; srun true && echo srun-ok'],
                            cwd=workdir, timeout=240)
        assert batch.returncode == 0, batch.stderr
        text = open(output).read()
        assert "file=%s" % sandbox_hints.TOPO_MOUNT in text and '<system version="2">' in text, text
        assert "srun-ok" in text, text
        # n2 has no file: its sandboxed steps get neither the mount nor the variable.
        other = cluster.srun("--sandbox", "-w", "n2", "sh", "-c", 'echo "file=${NCCL_TOPO_FILE:-none}"', cwd=workdir,
                             timeout=180)
        assert other.returncode == 0, other.stderr
        assert "file=none" in other.stdout
    finally:
        shutil.rmtree(os.path.join(etc, "topology"), ignore_errors=True)
