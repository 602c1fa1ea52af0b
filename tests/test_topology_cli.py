"""``slurmbox topology`` as a user types it: help with examples, JSON output, byte-identical
output on repeated runs, errors on stderr with a non-zero exit and no traceback."""

import json
import os
import subprocess
import sys

import pytest

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "topology")
UFM = os.path.join(DATA, "ibnetdiscover", "ufm-lab-switchib-edr-sx6012-fdr-mixed-loopback.txt")
RTX = os.path.join(DATA, "nvidia-smi-topo", "rtx6000ada-4gpu-pcie-only-4nic-2socket.txt")
IBSTAT = os.path.join(DATA, "ibstat", "ibstat-8hca-cx5-mixed-ib-multi-subnet-plus-ethernet.txt")
AZURE = os.path.join(DATA, "nccl-topo-xml", "azure-ndv5-h100-8gpu-8ib-topo.xml.txt")
BLOCKS = os.path.join(DATA, "topology-conf", "synthetic-slurm-testsuite-block-blocksizes-4-64.txt")


def slurmbox(*args):
    return subprocess.run([sys.executable, "-c", "from slurmbox.cli.main import cli; cli()", "topology"] + list(args),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["generate", "show", "place", "hints"])
def test_help_has_examples(command):
    out = slurmbox(command, "--help")
    assert out.returncode == 0 and "Examples:" in out.stdout and "slurmbox topology %s" % command in out.stdout


def test_generate_tree_is_byte_identical_and_written_atomically(tmp_path):
    first = slurmbox("generate", "--format", "tree", "--ibnetdiscover", UFM)
    second = slurmbox("generate", "--format", "tree", "--ibnetdiscover", UFM)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert "SwitchName=sw-f4521403005764b0 Nodes=r-ufm[96,100-101]" in first.stdout
    target = tmp_path / "topology.conf"
    written = slurmbox("generate", "--format", "tree", "--ibnetdiscover", UFM, "--out", str(target))
    assert written.returncode == 0 and target.read_text() == first.stdout
    assert oct(target.stat().st_mode & 0o777) == "0o644" and os.listdir(tmp_path) == ["topology.conf"]


def test_show_json_model():
    out = slurmbox("show", "--json", "--ibnetdiscover", UFM, "--nvidia-smi-topo", "gpu1=" + RTX,
                   "--ibstat", "gpu1=" + IBSTAT)
    assert out.returncode == 0, out.stderr
    model = json.loads(out.stdout)
    assert len(model["fabrics"]) == 1 and len(model["fabrics"][0]["links"]) == 10
    node = model["nodes"]["gpu1"]
    assert len(node["gpus"]) == 4 and len(node["nics"]) == 9  # 4 from the matrix + 5 more HCAs from ibstat
    assert model["trees"][0]["root"] == "S-e41d2d030003e470"


def test_show_text_mentions_unmapped_hcas():
    out = slurmbox("show", "--source", os.path.join(DATA, "ibnetdiscover", "manpage-voltaire-isr9024-sdr-small.txt"))
    assert out.returncode == 0
    assert "4 CA(s) name no host (map them with --ibstat HOST=FILE)" in out.stdout


def test_hints_shell_and_json():
    out = slurmbox("hints", "--nvidia-smi-topo", "gpu1=" + RTX, "--ibstat", "gpu1=" + IBSTAT, "--gpus", "0")
    assert out.returncode == 0, out.stderr
    assert "export NCCL_IB_HCA==mlx5_0:1,mlx5_1:1" in out.stdout
    assert json.loads(slurmbox("hints", "--nccl-xml", "n1=" + AZURE, "--gpus", "7", "--json").stdout) == {
        "NCCL_IB_HCA": "=NIC7"}


def test_generate_nccl_xml_round_trip(tmp_path):
    target = tmp_path / "nccl-topo.xml"
    out = slurmbox("generate", "--format", "nccl-xml", "--nccl-xml", "n1=" + AZURE, "--out", str(target))
    assert out.returncode == 0, out.stderr
    assert target.read_text().startswith('<system version="1">')


def test_place_with_free_list():
    out = slurmbox("place", "--nodes", "4", "--free", "node[01-08,13-14]", "--topology-conf", BLOCKS, "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["rule"] == "nvlink-domain" and result["hosts"] == ["node01", "node02", "node03", "node04"]


@pytest.mark.parametrize("args, message", [
    (["generate", "--format", "tree", "--ibnetdiscover", "/nonexistent/fabric.txt"], "cannot read /nonexistent"),
    (["generate", "--format", "tree"], "no topology source given"),
    (["generate", "--format", "block", "--topology-conf", BLOCKS, "--block-sizes", "4,12"], "power of two"),
    (["generate", "--format", "block", "--topology-conf", BLOCKS, "--block-sizes", "x"], "give integers"),
    (["generate", "--format", "nccl-xml", "--nccl-xml", "a=" + AZURE, "--nccl-xml", "b=" + AZURE], "--host"),
    (["generate", "--format", "tree", "--ibnetdiscover", RTX], "no Switch/Ca sections"),
    (["place", "--nodes", "3", "--free", "node[01-02]", "--topology-conf", BLOCKS], "only 2 free node"),
    (["hints", "--nvidia-smi-topo", "gpu1=" + RTX, "--gpus", "9"], "GPU 9 is not in this node"),
    (["generate", "--format", "tree", "--override", BLOCKS], "override"),
])
def test_errors_are_one_line_on_stderr(args, message):
    out = slurmbox(*args)
    assert out.returncode != 0
    assert message in out.stderr and "Traceback" not in out.stderr + out.stdout


def _has_rdma_or_gpu():
    return (os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband")) or \
        os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")


def test_local_without_devices_says_what_is_missing():
    if _has_rdma_or_gpu():
        pytest.skip("this machine has GPUs or RDMA devices")
    out = slurmbox("show", "--local")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "nothing found on this node" in out.stderr and "no NVIDIA GPUs" in out.stderr
    assert "no RDMA devices" in out.stderr


def test_run_ibnetdiscover_without_hca_fails_cleanly():
    if _has_rdma_or_gpu():
        pytest.skip("this machine has RDMA devices")
    out = slurmbox("generate", "--format", "tree", "--run-ibnetdiscover")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "ibnetdiscover" in out.stderr and ("needs a local HCA" in out.stderr or "not installed" in out.stderr)
