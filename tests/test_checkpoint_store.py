"""The checkpoint store, restore selection and checkpoint settings, without a cluster."""

import hashlib
import json
import os
import pwd
import signal
import subprocess
import sys

import pytest

from slurmbox.migrate import acl, policy
from slurmbox.migrate.restore import restore_spec, select_checkpoint
from slurmbox.migrate.store import CheckpointError, CheckpointStore, StoreFull, store_from_policy

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the store is root-owned; run as root")
USER = "sbxuser"


def _uid(name=USER):
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        pytest.skip("user %s is missing; run scripts/install.sh" % name)


def _write_checkpoint(store, job="7", step="batch", uid=None, payload=b"image-bytes" * 100, reason="test"):
    pending = store.begin(job, step, uid if uid is not None else _uid())
    with open(os.path.join(pending.image_dir, "checkpoint.img"), "wb") as handle:
        handle.write(payload)
    return pending.publish({"node": "n1", "reason": reason}, spec={"hostname": "n1", "mounts": []})


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    return CheckpointStore(str(root), keep_last=2)


@needs_root
def test_published_checkpoint_has_a_complete_manifest_and_verifies(store):
    ckpt = _write_checkpoint(store)
    manifest = ckpt.manifest
    assert ckpt.name == "ckpt-000001" and manifest["job"] == "7" and manifest["step"] == "batch"
    assert manifest["node"] == "n1" and manifest["uid"] == _uid() and manifest["parent"] is None
    files = {f["name"]: f for f in manifest["files"]}
    assert files["checkpoint.img"]["size"] == len(b"image-bytes" * 100)
    assert manifest["format"] == 2 and manifest["chunk_bytes"] == 32 << 20
    assert files["checkpoint.img"]["chunk_sha256"] == [hashlib.sha256(b"image-bytes" * 100).hexdigest()]
    assert manifest["spec_sha256"] == files["spec.json"]["chunk_sha256"][0]
    assert store.verify(ckpt, uid=_uid()).valid
    second = _write_checkpoint(store)
    assert second.manifest["parent"] == "ckpt-000001"


@needs_root
def test_keeps_only_the_last_k(store):
    for _ in range(4):
        _write_checkpoint(store)
    assert [c.name for c in store.checkpoints("7", "batch")] == ["ckpt-000004", "ckpt-000003"]


@needs_root
@pytest.mark.parametrize("damage", ["flip", "truncate", "no-manifest", "missing-file"])
def test_corrupt_latest_falls_back_to_previous(store, damage):
    _write_checkpoint(store, payload=b"first" * 1000)
    latest = _write_checkpoint(store, payload=b"second" * 1000)
    image = os.path.join(latest.path, "checkpoint.img")
    if damage == "flip":
        with open(image, "r+b") as handle:
            handle.seek(1234)
            byte = handle.read(1)
            handle.seek(1234)
            handle.write(bytes([byte[0] ^ 0x01]))
    elif damage == "truncate":
        os.truncate(image, 100)
    elif damage == "no-manifest":
        os.unlink(os.path.join(latest.path, "manifest.json"))
    else:
        os.unlink(image)
    selection = select_checkpoint(store, "7", "batch", _uid())
    assert selection.checkpoint.name == "ckpt-000001"
    assert [c.name for c, _ in selection.skipped] == ["ckpt-000002"]
    text = "\n".join(selection.messages())
    expected = {"flip": "sha256 mismatch", "truncate": "truncated", "no-manifest": "missing manifest",
                "missing-file": "checkpoint.img is missing"}[damage]
    assert expected in text and "restoring job 7 step batch from checkpoint ckpt-000001" in text


@needs_root
def test_checkpoint_of_another_user_is_never_selected(store):
    _write_checkpoint(store, uid=_uid())
    selection = select_checkpoint(store, "7", "batch", _uid() + 1)
    assert selection.checkpoint is None and "written for uid" in selection.skipped[0][1][0]


@needs_root
def test_interrupted_checkpoint_is_never_used_and_gc_removes_it(store, tmp_path):
    good = _write_checkpoint(store)
    # A writer killed while writing its image: a real process, SIGKILLed mid-write.
    code = ("import sys, os\n"
            "sys.path[:0] = %r\n"
            "from slurmbox.migrate.store import CheckpointStore\n"
            "p = CheckpointStore(%r).begin('7', 'batch', %d)\n"
            "f = open(os.path.join(p.image_dir, 'checkpoint.img'), 'wb')\n"
            "f.write(b'x' * 100000); f.flush()\n"
            "print(p.image_dir, flush=True)\n"
            "import time; time.sleep(60)\n" % (sys.path, store.root, _uid()))
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    tmp_dir = writer.stdout.readline().strip()
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert os.path.isdir(tmp_dir)
    assert [c.name for c in store.checkpoints("7", "batch")] == [good.name]
    assert select_checkpoint(store, "7", "batch", _uid()).checkpoint.name == good.name
    nxt = _write_checkpoint(store)  # the next sequence number skips past the interrupted one
    assert nxt.seq == 3
    removed = store.gc()
    assert tmp_dir in removed and not os.path.exists(tmp_dir)


@needs_root
def test_permissions_root_and_job_user_only():
    import shutil
    import tempfile

    base = tempfile.mkdtemp(prefix="sbx-ckpt-perm-", dir="/tmp")  # pytest's tmp_path is root-only
    os.chmod(base, 0o755)
    store = CheckpointStore(os.path.join(base, "store"))
    try:
        _check_permissions(store)
    finally:
        shutil.rmtree(base)


def _check_permissions(store):
    ckpt = _write_checkpoint(store)
    for path in (store.job_dir("7"), store.step_dir("7", "batch"), ckpt.path,
                 os.path.join(ckpt.path, "checkpoint.img")):
        info = os.stat(path)
        assert info.st_uid == 0 and info.st_mode & 0o007 == 0, path
        entries = acl.decode_acl(os.getxattr(path, acl.POSIX_ACL_XATTR))
        users = [(perm, ident) for tag, perm, ident in entries if tag == 0x02]
        assert users == [(5 if os.path.isdir(path) else 4, _uid())], (path, entries)
    # Through the kernel: the job's user reads, another user cannot even list.
    other = _uid("sbxother")
    for user, ok in ((USER, True), ("sbxother", False)):
        result = subprocess.run(["runuser", "-u", user, "--", "cat", os.path.join(ckpt.path, "manifest.json")],
                                capture_output=True, text=True)
        assert (result.returncode == 0) == ok, (user, result.stderr)
        listing = subprocess.run(["runuser", "-u", user, "--", "ls", store.job_dir("7")], capture_output=True)
        assert (listing.returncode == 0) == ok, user
    assert other != _uid()


@needs_root
def test_store_below_min_free_refuses_clearly(tmp_path):
    store = CheckpointStore(str(tmp_path / "s"), min_free_mb=10 ** 9)
    with pytest.raises(StoreFull, match="min_free_mb"):
        store.begin("7", "batch", 0)


@needs_root
def test_store_full_while_publishing_leaves_previous_intact(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        store = CheckpointStore(str(mount / "store"))
        good = _write_checkpoint(store, payload=b"a" * 50000)
        pending = store.begin("7", "batch", _uid())
        free = os.statvfs(str(mount)).f_bavail * os.statvfs(str(mount)).f_frsize
        with open(os.path.join(pending.image_dir, "checkpoint.img"), "wb") as handle:
            handle.write(b"b" * free)  # the image fits exactly; the manifest no longer does
        with pytest.raises(StoreFull, match="is full"):
            pending.publish({"node": "n1"}, spec={"mounts": []})
        assert [c.name for c in store.checkpoints("7", "batch")] == [good.name]
        assert store.verify(store.checkpoints("7", "batch")[0]).valid
        assert not [n for n in os.listdir(store.step_dir("7", "batch")) if n.startswith(".tmp")]
    finally:
        subprocess.run(["umount", str(mount)])


def test_names_are_checked(tmp_path):
    store = CheckpointStore(str(tmp_path))
    for bad in ("..", "a/b", "", "x" * 65):
        with pytest.raises(CheckpointError):
            store.step_dir(bad, "batch")


def test_unsupported_compression_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="compression"):
        CheckpointStore(str(tmp_path), compression="zstd")


def test_store_from_policy_reads_site_settings_with_defaults():
    class Settings:
        path, keep_last, compression, min_free_mb = "/srv/ckpt", 5, "none", 100

    class Policy:
        checkpoint_store = Settings()

    store = store_from_policy(Policy())
    assert (store.root, store.keep_last, store.min_free_mb) == ("/srv/ckpt", 5, 100)
    assert store_from_policy(object()).root == "/var/lib/slurmbox/checkpoints"


def test_acl_encoding_round_trips():
    data = acl.encode_acl(7, 1001, 5)
    assert acl.decode_acl(data) == [(1, 7, 0xFFFFFFFF), (2, 5, 1001), (4, 0, 0xFFFFFFFF), (0x10, 5, 0xFFFFFFFF),
                                    (0x20, 0, 0xFFFFFFFF)]
    with pytest.raises(ValueError):
        acl.decode_acl(b"\x01\x00\x00\x00")


class _Part:
    checkpoint_mode, checkpoint_interval_s, restore_fallback, preemptible = "transparent", 0, "fail", True


def test_settings_option_beats_environment_beats_partition():
    assert policy.resolve({}, {}, _Part()).mode == "transparent"
    assert policy.resolve({}, {}, _Part()).restore_fallback == "fail"
    env = {"SLURMBOX_SANDBOX_CHECKPOINT": "none", "SLURMBOX_SANDBOX_CHECKPOINT_INTERVAL": "2"}
    settings = policy.resolve({}, env, _Part())
    assert settings.mode == "none" and settings.interval_s == 120 and settings.explicit
    settings = policy.resolve({"checkpoint": "signal:USR2"}, env, _Part())
    assert settings.mode == "signal" and settings.signal == signal.SIGUSR2
    assert policy.resolve({"checkpoint": "signal"}, {}, None).signal == signal.SIGUSR1
    assert policy.resolve({}, {}, None).mode == "transparent"  # compiled policies without the field


@pytest.mark.parametrize("value, words", [("sometimes", "expected transparent"), ("signal:NOPE", "unknown signal"),
                                          ("transparent:USR1", "only signal mode"), ("signal:KILL", "cannot be caught")])
def test_bad_checkpoint_option_names_option_and_value(value, words):
    with pytest.raises(policy.CheckpointOptionError) as err:
        policy.resolve({"checkpoint": value}, {}, None)
    assert "--sandbox-checkpoint=%r" % value in str(err.value) and words in str(err.value)


def _runsc_help(name):
    with open(os.path.join(os.path.dirname(__file__), "data", "runsc", name)) as handle:
        return handle.read()


def test_gpu_sandbox_transparent_refused_without_cuda_checkpoint():
    old_help = _runsc_help("checkpoint-help-20240729.txt")  # recorded: no --cuda-checkpoint-path
    new_help = _runsc_help("checkpoint-help-20260817-source.txt")  # gVisor 2026's flags (SOURCES.md)
    explicit = policy.resolve({"checkpoint": "transparent"}, {}, None)
    with pytest.raises(policy.CheckpointOptionError, match="--sandbox-checkpoint=signal") as err:
        policy.refuse_gpu_transparent(explicit, {"nvidia"}, old_help)
    assert "no CUDA checkpoint support (runsc checkpoint --cuda-checkpoint-path" in str(err.value)
    assert policy.refuse_gpu_transparent(explicit, {"nvidia"}, new_help) is explicit
    with pytest.raises(policy.CheckpointOptionError, match="cuda-checkpoint, which runsc runs as root inside") as err:
        policy.refuse_gpu_transparent(explicit, {"nvidia"}, new_help, "the sandbox runs in the image /img")
    assert "cannot be used: the sandbox runs in the image /img" in str(err.value)
    with pytest.raises(policy.CheckpointOptionError, match="amd devices"):
        policy.refuse_gpu_transparent(explicit, {"amd"}, new_help)

    class Ondemand:
        checkpoint_mode, preemptible = "transparent", False

    default = policy.resolve({}, {}, Ondemand())
    assert policy.refuse_gpu_transparent(default, {"nvidia"}, old_help).mode == "none"
    assert policy.refuse_gpu_transparent(default, {"nvidia"}, new_help, "no binary").mode == "none"
    assert policy.gpu_checkpoint_flag(new_help) == "cuda-checkpoint-path"
    assert policy.gpu_checkpoint_flag({"cuda-checkpoint-path": {"type": "string"}}) == "cuda-checkpoint-path"
    assert policy.gpu_checkpoint_flag(old_help) is None
    assert policy.gpu_checkpoint_flag(_runsc_help("checkpoint-help-20221219.txt")) is None
    assert policy.cuda_checkpoint_flags(new_help) == ["--cuda-checkpoint-path=%s" % policy.CUDA_CHECKPOINT_MOUNT]
    assert policy.cuda_checkpoint_flags(old_help) == []


@needs_root
def test_only_a_cuda_checkpoint_that_root_alone_can_change_is_used(tmp_path):
    """gVisor runs it as root of the sandbox: the file and every directory above it must be root's alone."""
    base = tmp_path / "nv"
    base.mkdir()
    tool = base / "cuda-checkpoint"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    os.chmod(str(tmp_path), 0o755)
    assert policy.find_cuda_checkpoint(str(tool)) == (str(tool), None)
    os.chmod(str(tool), 0o775)
    path, problem = policy.find_cuda_checkpoint(str(tool))
    assert path is None and problem == "%s: %s is writable by group or others" % (tool, tool)
    os.chmod(str(tool), 0o755)
    os.chown(str(base), 65534, -1)  # a directory above it belongs to someone else: they could swap the file
    assert policy.find_cuda_checkpoint(str(tool))[1] == "%s: %s is owned by uid 65534, not root" % (tool, base)
    os.chown(str(base), 0, -1)
    os.chmod(str(tool), 0o644)
    assert policy.find_cuda_checkpoint(str(tool))[1] == "%s: not an executable file" % tool
    assert policy.find_cuda_checkpoint(str(tmp_path / "absent"))[1] == "%s: not found" % (tmp_path / "absent")
    link = tmp_path / "link"
    os.chmod(str(tool), 0o755)
    os.symlink(str(tool), str(link))  # the link's target is checked and bound
    assert policy.find_cuda_checkpoint(str(link)) == (str(tool), None)


def test_cuda_checkpoint_never_runs_with_the_users_loader_or_libraries():
    def blockers(image=None, mounts=(), env=(), allowed=True):
        return policy.cuda_checkpoint_blockers(image, list(mounts), list(env), allowed)

    assert blockers(mounts=["/data", "/scratch/usr", "/runs"], env=["PATH=/usr/bin", "CUDA_VISIBLE_DEVICES=0"]) == []
    assert blockers(allowed=False) == ["the site does not allow it (checkpoint_store.allow_cuda_checkpoint: gVisor "
                                       "runs it as the sandbox's root, where the program could replace it)"]
    assert blockers("/") == [  # an image of / is not the masked node root: treated as any image
        "the sandbox runs in the image / (--sandbox-image), whose libraries the loader would take"]
    assert blockers(mounts=["/usr/local/lib", "/etc", "/lib64/x", "/opt/conda", "/libfoo"]) == [
        "--sandbox-mounts puts a directory at /usr/local/lib, where the loader reads /usr",
        "--sandbox-mounts puts a directory at /etc, where the loader reads /etc",
        "--sandbox-mounts puts a directory at /lib64/x, where the loader reads /lib64",
        "--sandbox-mounts puts a directory at /opt/conda, where the loader reads /opt"]
    # Over the bound binary, also through the node's /var/run -> /run link.
    above = blockers(mounts=["/run"] + (["/var/run"] if os.path.realpath("/var/run") == "/run" else []))
    assert all("above where cuda-checkpoint is bound (/run/slurmbox-cuda-checkpoint/cuda-checkpoint)" in p
               for p in above) and len(above) == (2 if os.path.realpath("/var/run") == "/run" else 1)
    assert blockers(env=["PATH=/bin", "LD_PRELOAD=/tmp/x.so", "GLIBC_TUNABLES=a", "TZDIR=/tmp", "X=LD_"]) == [
        "the job's environment sets GLIBC_TUNABLES, LD_PRELOAD, TZDIR, which the loader would act on (unset them)"]


@needs_root
def test_restore_spec_maps_node_specific_sources(store, tmp_path):
    ckpt = _write_checkpoint(store)
    saved = {"hostname": "n1", "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/old/spool/job1/slurm_script", "type": "bind", "source": "/old/spool/job1/slurm_script"},
        {"destination": "/run/slurmbox-broker", "type": "bind", "source": "/run/n1/1.batch/broker"}]}
    with open(os.path.join(ckpt.path, "spec.json"), "w") as handle:
        json.dump(saved, handle)
    ckpt.manifest["batch_script"] = "/old/spool/job1/slurm_script"
    new = {"hostname": "n2", "mounts": [
        {"destination": "/new/spool/job1/slurm_script", "type": "bind", "source": "/new/spool/job1/slurm_script"},
        {"destination": "/run/slurmbox-broker", "type": "bind", "source": "/run/n2/1.batch/broker"}]}
    spec = restore_spec(ckpt, new, "/new/spool/job1/slurm_script")
    assert spec["hostname"] == "n1"
    assert [(m["destination"], m["source"]) for m in spec["mounts"]] == [
        ("/proc", "proc"), ("/old/spool/job1/slurm_script", "/new/spool/job1/slurm_script"),
        ("/run/slurmbox-broker", "/run/n2/1.batch/broker")]
    saved["mounts"].append({"destination": "/data", "type": "bind", "source": str(tmp_path / "nonexistent")})
    with open(os.path.join(ckpt.path, "spec.json"), "w") as handle:
        json.dump(saved, handle)
    with pytest.raises(CheckpointError, match="does not exist on this node"):
        restore_spec(ckpt, new, "/new/spool/job1/slurm_script")


def _gpu_spec(minors, mounts=()):
    devices = [{"path": "/dev/nvidia%d" % m, "type": "c", "major": 195, "minor": m, "fileMode": 0o666, "uid": 0,
                "gid": 0} for m in minors]
    return {"hostname": "n", "mounts": list(mounts),
            "linux": {"namespaces": [{"type": "pid"}], "devices": devices,
                      "resources": {"memory": {"limit": 1 << 30}, "devices": [{"allow": False, "access": "rwm"}] + [
                          {"allow": True, "type": "c", "major": 195, "minor": m, "access": "rwm"} for m in minors]}},
            "annotations": {"org.slurmbox.devices": ",".join("/dev/nvidia%d" % m for m in minors)}}


@needs_root
@pytest.mark.parametrize("now", [[2, 3], []])
def test_restore_spec_gives_the_sandbox_this_runs_devices_not_the_checkpointed_ones(store, now):
    ckpt = _write_checkpoint(store)
    with open(os.path.join(ckpt.path, "spec.json"), "w") as handle:
        json.dump(_gpu_spec([0, 1]), handle)  # the run that was checkpointed held GPUs 0 and 1
    spec = restore_spec(ckpt, _gpu_spec(now))
    assert [d["path"] for d in spec["linux"]["devices"]] == ["/dev/nvidia%d" % m for m in now]
    allowed = [r["minor"] for r in spec["linux"]["resources"]["devices"] if r["allow"]]
    assert allowed == now and spec["linux"]["resources"]["devices"][0] == {"allow": False, "access": "rwm"}
    assert spec["annotations"]["org.slurmbox.devices"] == ",".join("/dev/nvidia%d" % m for m in now)
    assert spec["linux"]["resources"]["memory"] == {"limit": 1 << 30}  # the rest is the saved spec's
    assert spec["linux"]["namespaces"] == [{"type": "pid"}]
    bare = {"hostname": "n", "mounts": [], "linux": {}}  # this run's spec has no device rules at all
    spec = restore_spec(ckpt, bare)
    assert spec["linux"]["devices"] == [] and "devices" not in spec["linux"]["resources"]
    assert "org.slurmbox.devices" not in spec["annotations"]


@needs_root
def test_checkpoint_of_a_different_batch_script_is_skipped(store):
    pending = store.begin("7", "batch", _uid())
    with open(os.path.join(pending.image_dir, "checkpoint.img"), "wb") as handle:
        handle.write(b"image")
    pending.publish({"node": "n1", "batch_script_sha256": "a" * 64})
    assert select_checkpoint(store, "7", "batch", _uid(), "a" * 64).checkpoint is not None
    selection = select_checkpoint(store, "7", "batch", _uid(), "b" * 64)
    assert selection.checkpoint is None and "different batch script" in selection.skipped[0][1][0]


@needs_root
def test_checkpoint_command_line_and_failure_cleanup(store, tmp_path):
    from slurmbox.migrate.runsc_checkpoint import CheckpointFailed, checkpoint_sandbox

    fake = tmp_path / "fake-runsc"  # records its argv as the image, as runsc would write checkpoint.img
    fake.write_text("#!/bin/sh\ncase \"$*\" in *--help*|*--version*) exit 0;; esac\n"  # no flags to report
                    "all=\"$*\"\nwhile [ \"$1\" != --image-path ]; do shift; done\n"
                    "[ \"$3\" = fail ] && { echo 'checkpoint failed: boom' >&2; exit 128; }\n"
                    "echo \"$all\" > \"$2/checkpoint.img\"\n")
    fake.chmod(0o755)
    pending = store.begin("9", "batch", _uid())
    ckpt, _took = checkpoint_sandbox([str(fake), "--root", "/x"], "cid", pending, {"reason": "unit"}, {"mounts": []},
                                     ["--cuda-checkpoint-path=/usr/bin/cuda-checkpoint"])
    assert ckpt.manifest["reason"] == "unit" and store.verify(ckpt).valid
    with open(os.path.join(ckpt.path, "checkpoint.img")) as handle:
        assert handle.read().split() == ["--root", "/x", "checkpoint", "--cuda-checkpoint-path=/usr/bin/cuda-checkpoint",
                                         "--image-path",
                                         pending.image_dir, "cid"]
    pending = store.begin("9", "batch", _uid())
    with pytest.raises(CheckpointFailed, match="boom"):
        checkpoint_sandbox([str(fake)], "fail", pending, {}, {"mounts": []})
    assert not os.path.exists(pending.image_dir)
    assert [c.name for c in store.checkpoints("9", "batch")] == [ckpt.name]


@needs_root
def test_a_checkpoint_of_another_runsc_release_is_skipped_for_an_older_one_of_this_release(store):
    pending = store.begin("7", "batch", _uid())
    with open(os.path.join(pending.image_dir, "checkpoint.img"), "wb") as handle:
        handle.write(b"old" * 100)
    older = pending.publish({"node": "n1", "reason": "test", "runsc": {"version": "0.0~20221219.0"}},
                            spec={"hostname": "n1", "mounts": []})
    pending = store.begin("7", "batch", _uid())
    with open(os.path.join(pending.image_dir, "checkpoint.img"), "wb") as handle:
        handle.write(b"new" * 100)
    newer = pending.publish({"node": "n2", "reason": "test", "runsc": {"version": "0.0~20240729.0"}},
                            spec={"hostname": "n1", "mounts": []})
    selection = select_checkpoint(store, "7", "batch", _uid(), runsc_features={"version": "0.0~20221219.0"})
    assert selection.checkpoint.name == older.name
    assert [c.name for c, _ in selection.skipped] == [newer.name]
    assert "written by runsc 0.0~20240729.0; this node's runsc 0.0~20221219.0 cannot restore it" in \
        "\n".join(selection.messages())
    # Unknown versions are not judged.
    assert select_checkpoint(store, "7", "batch", _uid(), runsc_features={}).checkpoint.name == newer.name


@needs_root
@pytest.mark.parametrize("case", ["bound", "missing", "image", "mount", "environment", "not-allowed"])
def test_step_start_binds_cuda_checkpoint_or_refuses_saying_what_is_wrong(tmp_path, case):
    """The supervisor's glue: a transparent GPU sandbox on a runsc with --cuda-checkpoint-path gets that flag and
    the node's binary to bind, or is refused (the user asked for transparent) saying why."""
    import types
    from slurmbox.step.supervisor import StepFailure, Supervisor
    from slurmbox.settings.compiled import CheckpointStore as StoreSettings, SitePolicy

    runsc = tmp_path / "runsc"  # answers --help (and --version) as gVisor 2026 would
    runsc.write_text("#!/bin/sh\ncase \"$*\" in *--version*) echo 'runsc version release-20260817.0';; "
                     "*restore*) cat '%s' >&2;; *) cat '%s' >&2;; esac\nexit 128\n"
                     % (os.path.join(os.path.dirname(__file__), "data", "runsc", "restore-help-20260817-source.txt"),
                        os.path.join(os.path.dirname(__file__), "data", "runsc", "checkpoint-help-20260817-source.txt")))
    runsc.chmod(0o755)
    tool = tmp_path / "nv" / "cuda-checkpoint"
    tool.parent.mkdir()
    os.chmod(str(tmp_path), 0o755)
    if case != "missing":
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    args = types.SimpleNamespace(option=["checkpoint=transparent"], runtime_dir=str(tmp_path), node="n1", job="5",
                                 step="batch", step_dir=str(tmp_path / "step"), local_tasks=1, partition="spot")
    sup = Supervisor(args)
    sup.policy = SitePolicy(checkpoint_store=StoreSettings(cuda_checkpoint=str(tool),
                                                           allow_cuda_checkpoint=case != "not-allowed"))
    plan = types.SimpleNamespace(vendor="nvidia")
    image = str(tmp_path / "image") if case == "image" else None
    mounts = ["/usr/lib/x86_64-linux-gnu"] if case == "mount" else ["/data"]
    environment = ["PATH=/usr/bin"] + (["LD_LIBRARY_PATH=/tmp/lib"] if case == "environment" else [])
    if case == "bound":
        settings = sup._checkpoint_settings({}, plan, [str(runsc)], image=image, mounts=mounts,
                                            environment=environment)
        assert settings.mode == "transparent"
        assert sup.checkpoint_flags == ["--cuda-checkpoint-path=%s" % policy.CUDA_CHECKPOINT_MOUNT]
        assert sup.cuda_checkpoint_source == str(tool)
        return
    with pytest.raises(StepFailure) as err:
        sup._checkpoint_settings({}, plan, [str(runsc)], image=image, mounts=mounts, environment=environment)
    assert "cuda-checkpoint, which runsc runs as root inside the sandbox to save them, cannot be used: " + {
        "missing": "%s: not found" % tool,
        "image": "the sandbox runs in the image %s (--sandbox-image)" % image,
        "mount": "--sandbox-mounts puts a directory at /usr/lib/x86_64-linux-gnu, where the loader reads /usr",
        "environment": "the job's environment sets LD_LIBRARY_PATH",
        "not-allowed": "the site does not allow it (checkpoint_store.allow_cuda_checkpoint",
    }[case] in str(err.value)
    assert "--sandbox-checkpoint=signal" in str(err.value) and sup.cuda_checkpoint_source is None



def test_a_checkpoint_holding_gpu_state_restores_only_with_as_many_gpus(store):
    """select_checkpoint skips, saying why, a checkpoint whose CUDA state was taken on another number of GPUs."""
    from slurmbox.sandbox import devices

    two = {"vendor": "nvidia", "count": 2}
    pending = store.begin("8", "batch", os.getuid())
    with open(os.path.join(pending.image_dir, "checkpoint.img"), "wb") as handle:
        handle.write(b"image")
    pending.publish({"node": "n1", "accelerators": two})
    assert select_checkpoint(store, "8", "batch", os.getuid(), accelerators=dict(two)).checkpoint is not None
    for now in ({"vendor": "nvidia", "count": 1}, None):
        selection = select_checkpoint(store, "8", "batch", os.getuid(), accelerators=now)
        assert selection.checkpoint is None
        assert "taken with 2 nvidia device(s), and this run has %s" % ("1 nvidia" if now else "0 accelerator") in \
            selection.skipped[0][1][0]
    # A checkpoint without GPU state restores anywhere.
    pending = store.begin("9", "batch", os.getuid())
    with open(os.path.join(pending.image_dir, "checkpoint.img"), "wb") as handle:
        handle.write(b"image")
    pending.publish({"node": "n1"})
    assert select_checkpoint(store, "9", "batch", os.getuid(), accelerators=two).checkpoint is not None
    # What is recorded: the per-GPU device files, not the shared control nodes.
    plan = devices.DevicePlan(vendor="nvidia", devices=[
        devices.Device("/dev/nvidia%s" % n, "/dev/nvidia%s" % n, "c", 195, m)
        for n, m in (("0", 0), ("3", 3), ("ctl", 255), ("-uvm", 511))])
    assert devices.accelerators(plan) == dict(two, models=[]) and devices.accelerators(devices.DevicePlan()) is None
    assert devices.accelerators(plan, ["h100", "h100"])["models"] == ["h100"]
    # Typed gres on both sides must name the same model; untyped on either side is not judged.
    pending = store.begin("10", "batch", os.getuid())
    with open(os.path.join(pending.image_dir, "checkpoint.img"), "wb") as handle:
        handle.write(b"image")
    pending.publish({"node": "n1", "accelerators": dict(two, models=["h100"])})
    selection = select_checkpoint(store, "10", "batch", os.getuid(), accelerators=dict(two, models=["a100"]))
    assert selection.checkpoint is None and "taken on h100 GPUs, and this run has a100" in selection.skipped[0][1][0]
    for models in (["h100"], []):
        assert select_checkpoint(store, "10", "batch", os.getuid(),
                                 accelerators=dict(two, models=models)).checkpoint is not None
