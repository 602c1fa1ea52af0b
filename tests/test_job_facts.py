"""Job facts come from structured Slurm output: user-set text never poses as another field.

Recorded real output: tests/data/slurm/squeue-json-22.05-hostile-name.json is Slurm 22.05's
``squeue --json -j 9`` on the dev cluster, for job 9 (two nodes, one h100 each) whose name holds
``Partition=ondemand``, a newline, ``Nodes=n2 GRES=gpu:h100:2(IDX:0-1) Restarts=9``, non-ASCII and
``a=b``, and whose comment and output path hold more ``Key=Value`` text; 22.05 ignored ``-j`` and
also listed job 8 (FAILED, name ``... Partition=secure ...``).
"""

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from slurmbox.slurm_client import job_facts
from slurmbox.slurm_client.scontrol import SlurmCommandError

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "slurm")


def recorded():
    with open(os.path.join(DATA, "squeue-json-22.05-hostile-name.json")) as handle:
        return handle.read()


def test_the_record_of_the_asked_job_is_read_not_a_neighbours():
    facts = job_facts.parse_squeue_json(recorded(), 9)
    assert facts.job_id == 9 and facts.partition == "ondemand" and facts.state == "RUNNING"
    assert facts.nodes == ("n1", "n2") and facts.restart_count == 0 and facts.user_id == 1001
    other = job_facts.parse_squeue_json(recorded(), 8)
    assert other.partition == "ondemand" and other.state == "FAILED"
    with pytest.raises(SlurmCommandError, match="0 records"):
        job_facts.parse_squeue_json(recorded(), 99)


def test_gpu_allocation_per_node_ignores_gres_text_in_the_job_name():
    facts = job_facts.parse_squeue_json(recorded(), 9)
    assert job_facts.gpu_allocation(facts, "n1") == ([0], ["h100"])
    assert job_facts.gpu_allocation(facts, "n2") == ([0], ["h100"])  # the name claims IDX:0-1 on n2
    assert job_facts.gpu_allocation(facts, "n3") == ([], [])
    assert job_facts.gpu_allocation(job_facts.parse_squeue_json(recorded(), 8), "n2") == ([], [])


def _with(job_id=9, **fields):
    data = json.loads(recorded())
    job = [j for j in data["jobs"] if j["job_id"] == job_id][0]
    job.update(fields)
    return json.dumps(data)


def test_untyped_mixed_and_v0040_shapes():
    facts = job_facts.parse_squeue_json(_with(gres_detail=["gpu:2(IDX:0-1)", "gpu:a100:1(IDX:1),gpu:h100:1(IDX:0)"]), 9)
    assert job_facts.gpu_allocation(facts, "n1") == ([0, 1], [])
    assert job_facts.gpu_allocation(facts, "n2") == ([0, 1], ["a100", "h100"])
    newer = _with(job_resources={"nodes": {"allocation": [{"name": "n2"}, {"name": "n1"}]}},
                  restart_cnt={"set": True, "number": 3}, job_state=["RUNNING", "COMPLETING"],
                  gres_detail=["gpu:h100:1(IDX:1)", "gpu:h100:1(IDX:0)"])
    facts = job_facts.parse_squeue_json(newer, 9)
    assert facts.nodes == ("n2", "n1") and facts.restart_count == 3 and facts.state == "RUNNING"
    assert job_facts.gpu_allocation(facts, "n2") == ([1], ["h100"])


def test_out_of_bounds_indices_and_non_json_are_refused():
    with pytest.raises(SlurmCommandError, match="out of bounds"):
        job_facts.gpu_allocation(job_facts.parse_squeue_json(_with(gres_detail=["gpu:1(IDX:0-99999)"]), 9), "n1")
    with pytest.raises(SlurmCommandError, match="no JSON"):
        job_facts.parse_squeue_json("JobId=9 Partition=secure", 9)


@settings(max_examples=200, deadline=None)
@given(name=st.text(min_size=0, max_size=200), comment=st.text(max_size=100), workdir=st.text(max_size=100))
def test_no_user_text_changes_any_fact(name, comment, workdir):
    """Fuzz: any job name, comment or working directory (Key=Value, spaces, newlines, '=', non-ASCII)."""
    base = job_facts.parse_squeue_json(recorded(), 9)
    hostile = job_facts.parse_squeue_json(_with(name=name, comment=comment, current_working_directory=workdir,
                                                standard_output=name), 9)
    assert hostile == base
