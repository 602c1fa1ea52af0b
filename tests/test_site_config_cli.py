"""`slurmbox config validate|show` through the real command line: exit codes,
compiler-style problem lines on stderr, --json, never a traceback."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from slurmbox.settings.model import compile_site, load_site_file

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "site-configs")
EXAMPLES = sorted(name for name in os.listdir(EXAMPLES_DIR) if name.endswith(".yaml"))


def slurmbox(*args):
    return subprocess.run([sys.executable, "-m", "slurmbox.cli.main", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("name", EXAMPLES)
def test_validate_accepts_every_example(name):
    path = os.path.join(EXAMPLES_DIR, name)
    result = slurmbox("config", "validate", path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("%s: valid: cluster " % path)
    data = json.loads(slurmbox("config", "validate", "--json", path).stdout)
    assert data["valid"] is True and data["partitions"] == sorted(load_site_file(path).partitions)


def test_validate_reports_each_problem_with_file_line_and_key_path(tmp_path):
    bad = tmp_path / "site.yaml"
    bad.write_text("cluster: demo\n"
                   "node_groups:\n"
                   "  gpu:\n"
                   "    nodes: n[1-4]\n"
                   "    vendor: nvidia\n"
                   "    model: h100\n"
                   "    count: 8\n"
                   "    devices: /dev/nvidia[0-3]\n"
                   "    cpus: 64\n"
                   "    real_memory_mb: 500000\n"
                   "partitions:\n"
                   "  spot:\n"
                   "    nodes: [gpu]\n"
                   "    spot: true\n"
                   "    default_profile: ghost\n")
    result = slurmbox("config", "validate", str(bad))
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert "%s:8: node_groups.gpu.devices: count is 8 but devices /dev/nvidia[0-3] lists 4 device files; they " \
           "must agree" % bad in lines
    assert any(l.startswith("%s:15: partitions.spot.default_profile: partition 'spot' names profile 'ghost'" % bad)
               for l in lines), lines
    assert any(l.startswith("%s:12: partitions.spot: spot partition 'spot' needs preemption settings" % bad)
               for l in lines), lines
    data = json.loads(slurmbox("config", "validate", "--json", str(bad)).stdout)
    assert data["valid"] is False
    assert {(p["path"], p["line"]) for p in data["problems"]} == {
        ("node_groups.gpu.devices", 8), ("partitions.spot.default_profile", 15), ("partitions.spot", 12)}


@pytest.mark.parametrize("content, needle", [
    (b"\x7fELF\x02\x01\x01\x00\xff\xfe binary", "not UTF-8 text"),
    (b"\x7fELF\x02\x01\x01\x00", "not valid YAML: unacceptable character"),
    (b"key: [unclosed\n", "not valid YAML"),
    (b"- a\n- b\n", "expected a mapping"),
    (b"", "empty document"),
])
def test_files_that_are_not_site_configurations_exit_2_without_traceback(tmp_path, content, needle):
    path = tmp_path / "odd"
    path.write_bytes(content)
    result = slurmbox("config", "validate", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(str(path)) and needle in result.stderr


def test_unreadable_paths_exit_2(tmp_path):
    for path in (tmp_path / "missing.yaml", tmp_path):
        result = slurmbox("config", "validate", str(path))
        assert result.returncode == 2 and "cannot read the file" in result.stderr
        assert "Traceback" not in result.stderr


def test_show_prints_the_compiled_policy():
    path = os.path.join(EXAMPLES_DIR, "hgx-h100-h200-spot.yaml")
    data = json.loads(slurmbox("config", "show", "--json", path).stdout)
    assert data == json.loads(json.dumps(compile_site(load_site_file(path)).to_json()))
    spot = json.loads(slurmbox("config", "show", "--json", "--partition", "spot", path).stdout)
    assert spot["preemptible"] is True and spot["checkpoint_interval_s"] == 1800
    text = slurmbox("config", "show", path).stdout
    assert "spot: sandbox required, profile untrusted (allowed: untrusted, eval), preemptible (spot)" in text
    missing = slurmbox("config", "show", "--partition", "nope", path)
    assert missing.returncode == 2 and "no partition 'nope'" in missing.stderr


@pytest.mark.parametrize("args", [("config",), ("config", "validate"), ("config", "render"), ("config", "show"),
                                  ("doctor",), ("sandbox",), ("sandbox", "ls"), ("sandbox", "inspect"),
                                  ("sandbox", "kill"), ("plugin",), ("plugin", "install"), ("dev-cluster",),
                                  ("dev-cluster", "up"), ("dev-cluster", "down"), ("dev-cluster", "status")])
def test_every_command_has_help_with_examples(args):
    result = slurmbox(*args, "--help")
    assert result.returncode == 0 and "Examples:" in result.stdout
    examples = result.stdout.split("Examples:", 1)[1]
    assert "slurmbox %s" % " ".join(args) in examples, examples  # an example of this very command


def test_render_into_a_path_that_is_not_a_directory_says_what_to_do(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    result = slurmbox("config", "render", os.path.join(EXAMPLES_DIR, "mi300x-rocm.yaml"), "--out", str(not_a_dir))
    assert result.returncode != 0 and result.stdout == "" and "Traceback" not in result.stderr
    assert "cannot write into %s" % not_a_dir in result.stderr and "pass --out a directory" in result.stderr
    assert not_a_dir.read_text() == "x"


def test_dev_cluster_up_boots_from_rendered_files(tmp_path, monkeypatch):
    """`dev-cluster up --rendered DIR` hands the rendered files to the cluster as they are."""
    from click.testing import CliRunner

    from slurmbox.cli.main import cli
    from slurmbox.dev_cluster import cluster as cluster_module

    from slurmbox.settings.model import SiteLoader

    example = yaml.load(open(os.path.join(EXAMPLES_DIR, "mi300x-rocm.yaml")).read(), Loader=SiteLoader)
    group = next(iter(example["node_groups"].values()))
    group.update(nodes="n[1-2]", node_addr=["10.213.7.11", "10.213.7.12"])
    example["slurmbox"] = {"site_config": str(tmp_path / "c" / "etc" / "site.yaml"),
                           "runtime_dir": str(tmp_path / "c" / "run" / "slurmbox")}
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(example, sort_keys=False))
    site = str(site)
    out = tmp_path / "rendered"
    rendered = slurmbox("config", "render", site, "--out", str(out))
    assert rendered.returncode == 0, rendered.stderr
    made = {}
    real = cluster_module.DevCluster

    class FakeCluster(real):
        def __init__(self, directory, nodes, gpus_per_node, subnet, prefix, nodes_conf=None, extra_files=None):
            super().__init__(directory, nodes, gpus_per_node, subnet, prefix, nodes_conf=nodes_conf,
                             extra_files=extra_files)
            made.update(directory=directory, nodes_conf=nodes_conf, extra_files=extra_files)

        def up(self):
            return "/x/etc/slurm.conf"

    monkeypatch.setattr(cluster_module, "DevCluster", FakeCluster)
    result = CliRunner().invoke(cli, ["dev-cluster", "up", "--rendered", str(out), "--site-config", site,
                                      "--dir", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert "export SLURM_CONF=/x/etc/slurm.conf" in result.output
    assert made["nodes_conf"] == (out / "slurm-nodes.conf").read_text()
    expected = {name: (out / name).read_text() for name in ("gres.conf", "cgroup.conf", "plugstack.conf")}
    expected["site.yaml"] = open(site).read()
    assert made["extra_files"] == expected  # no topology.conf was rendered, none is passed

    # An example rendered as shipped names other nodes and paths: refused before anything starts.
    shipped = tmp_path / "shipped"
    assert slurmbox("config", "render", os.path.join(EXAMPLES_DIR, "mi300x-rocm.yaml"), "--out",
                    str(shipped)).returncode == 0
    made.clear()
    refused = CliRunner().invoke(cli, ["dev-cluster", "up", "--rendered", str(shipped), "--dir", str(tmp_path / "c")])
    assert refused.exit_code != 0 and "do not fit this dev cluster" in refused.output, refused.output
    assert "names node(s) mi300x-01" in refused.output and "name the site's nodes n1..n2" in refused.output
    assert "set slurmbox.settings: %s" % (tmp_path / "c" / "etc" / "site.yaml") in refused.output
    assert "set slurmbox.runtime_dir:" in refused.output

    (out / "slurm-nodes.conf").unlink()
    missing = CliRunner().invoke(cli, ["dev-cluster", "up", "--rendered", str(out), "--dir", str(tmp_path / "c")])
    assert missing.exit_code != 0 and "run 'slurmbox config render FILE --out" in missing.output
    alone = CliRunner().invoke(cli, ["dev-cluster", "up", "--site-config", site, "--dir", str(tmp_path / "c")])
    assert alone.exit_code == 2 and "--site-config goes with --rendered" in alone.output
