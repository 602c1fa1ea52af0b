"""``slurmbox checkpoint ls/verify/gc`` on a real store, run as root, the job's user and another user."""

import json
import os
import shutil
import subprocess
import tempfile

import pytest

from test_checkpoint_store import _uid, _write_checkpoint
from slurmbox.migrate.store import CheckpointStore

PREFIX = os.environ.get("SLURMBOX_PREFIX", "/opt/slurmbox")
SLURMBOX = os.path.join(PREFIX, "venv", "bin", "slurmbox")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SLURMBOX),
                                reason="needs root and an installed slurmbox (scripts/install.sh)")


@pytest.fixture
def store():
    base = tempfile.mkdtemp(prefix="sbx-ckpt-cli-", dir="/tmp")
    os.chmod(base, 0o755)
    yield CheckpointStore(os.path.join(base, "store"))
    shutil.rmtree(base)


def cli(*args, user="root"):
    cmd = [SLURMBOX, "checkpoint"] + list(args)
    if user != "root":
        cmd = ["runuser", "-u", user, "--"] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")


def test_ls_lists_for_owner_and_root_and_refuses_other_users(store):
    _write_checkpoint(store, job="41")
    _write_checkpoint(store, job="41")
    for user in ("root", "sbxuser"):
        result = cli("ls", "41", "--json", "--store", store.root, user=user)
        assert result.returncode == 0, result.stderr
        rows = json.loads(result.stdout)
        assert [r["name"] for r in rows] == ["ckpt-000002", "ckpt-000001"]
        assert rows[0]["node"] == "n1" and rows[0]["parent"] == "ckpt-000001" and rows[0]["manifest"] == "ok"
    other = cli("ls", "41", "--store", store.root, user="sbxother")
    assert other.returncode == 1 and "belong to another user" in other.stderr and "Traceback" not in other.stderr
    everything = cli("ls", "--store", store.root, user="sbxother")  # lists nothing it may not read
    assert everything.returncode == 0 and "ckpt-0" not in everything.stdout
    table = cli("ls", "--store", store.root)
    assert "ckpt-000002" in table.stdout and "JOB" in table.stdout


def test_verify_reports_corruption_with_exit_status(store):
    _write_checkpoint(store, job="42")
    latest = _write_checkpoint(store, job="42")
    ok = cli("verify", "42", "--store", store.root)
    assert ok.returncode == 0 and ok.stdout.count(": ok") == 2, ok.stdout
    with open(os.path.join(latest.path, "checkpoint.img"), "r+b") as handle:
        handle.write(b"X")
    bad = cli("verify", "42", "--json", "--store", store.root)
    assert bad.returncode == 1
    results = {r["name"]: r for r in json.loads(bad.stdout)}
    assert not results["ckpt-000002"]["valid"] and "sha256 mismatch" in results["ckpt-000002"]["problems"][0]
    assert results["ckpt-000001"]["valid"]


def test_gc_is_root_only_and_removes_partial_checkpoints(store):
    _write_checkpoint(store, job="43")
    partial = store.begin("43", "batch", _uid())
    os.rename(partial.image_dir, partial.image_dir.replace("-%d-" % os.getpid(), "-999999999-"))  # writer gone
    refused = cli("gc", "--store", store.root, user="sbxuser")
    assert refused.returncode == 1 and "must run as root" in refused.stderr
    result = cli("gc", "--json", "--store", store.root)
    assert result.returncode == 0, result.stderr
    removed = json.loads(result.stdout)["removed"]
    assert len(removed) == 1 and "/.tmp-" in removed[0]
    assert [c.name for c in store.checkpoints("43", "batch")] == ["ckpt-000001"]


def test_help_has_examples():
    for args in (["checkpoint", "ls", "--help"], ["migrate", "--help"], ["spot-watch", "--help"]):
        result = subprocess.run([SLURMBOX] + args, capture_output=True, text=True)
        assert result.returncode == 0 and "Examples" in result.stdout, args
