"""runsc checkpoint flag detection and the command lines built for each runsc build.

Uses ``runsc checkpoint --help`` outputs recorded from Debian 12's and Debian
13's runsc (tests/data/runsc/SOURCES.md) and a fake runsc printing them.
"""

import json
import os

import pytest

from slurmbox.migrate import runsc_checkpoint as rc
from slurmbox.migrate.store import IMAGE_COMPRESSIONS, CheckpointError, CheckpointStore

DATA = os.path.join(os.path.dirname(__file__), "data", "runsc")
OLD, NEW = "20221219", "20240729"
#: gVisor release-20260817.0's help, rebuilt from its source (not a recording: tests/data/runsc/SOURCES.md).
SOURCE_2026 = "20260817-source"


def recorded(kind, version):
    with open(os.path.join(DATA, "%s-%s.txt" % (kind, version))) as handle:
        return handle.read()


def fake_runsc(tmp_path, version, name="runsc"):
    """A script answering ``checkpoint --help``, ``restore --help`` (on stderr, exit 128) and ``--version`` as the
    recorded build did, counting calls,
    and recording the argv of a real checkpoint as the image file."""
    directory = tmp_path / ("bin-%s" % version)
    directory.mkdir(exist_ok=True)
    (directory / "help.txt").write_text(recorded("checkpoint-help", version))
    (directory / "restore-help.txt").write_text(recorded("restore-help", version))
    (directory / "version.txt").write_text(recorded("version", version))
    script = directory / name
    script.write_text(
        "#!/bin/sh\nd=$(dirname \"$0\")\necho x >> \"$d/calls\"\n"
        "case \"$*\" in *--version*) cat \"$d/version.txt\"; exit 0;;\n"
        "  *restore*--help*) cat \"$d/restore-help.txt\" >&2; exit 128;; *--help*) cat \"$d/help.txt\" >&2; exit 128;; esac\n"
        "all=\"$*\"\nwhile [ \"$1\" != --image-path ]; do shift; done\necho \"$all\" > \"$2/checkpoint.img\"\n")
    script.chmod(0o755)
    return str(script), directory / "calls"


def test_parse_old_build_has_no_compression_flag():
    flags = rc.parse_checkpoint_help(recorded("checkpoint-help", OLD))
    assert sorted(flags) == ["image-path", "leave-running", "work-path"]
    assert flags["leave-running"]["type"] == "bool" and flags["image-path"]["type"] == "string"


def test_parse_new_build_lists_compression_values_and_default():
    flags = rc.parse_checkpoint_help(recorded("checkpoint-help", NEW))
    assert sorted(flags) == ["compression", "direct", "exclude-committed-zero-pages", "image-path",
                             "leave-running", "work-path"]
    assert flags["compression"]["values"] == ["none", "flate-best-speed"]
    assert flags["compression"]["default"] == "flate-best-speed"
    assert flags["direct"] == {"type": "bool", "values": None, "default": None}


def test_parse_unrecognised_text_gives_no_flags():
    assert rc.parse_checkpoint_help("") == {}
    assert rc.parse_checkpoint_help("flag provided but not defined: -help\n") == {}


@pytest.mark.parametrize("version,compression,direct,expected_flags,expected_effective", [
    (OLD, "none", False, [], "flate-best-speed"),  # the 2022 build always compresses
    (OLD, "flate-best-speed", False, [], "flate-best-speed"),
    (OLD, "none", True, [], "flate-best-speed"),  # no -direct there: not passed
    (NEW, "none", False, ["--compression=none"], "none"),
    (NEW, "flate-best-speed", False, ["--compression=flate-best-speed"], "flate-best-speed"),
    (NEW, "none", True, ["--compression=none", "--direct"], "none"),
])
def test_flags_for_each_build(version, compression, direct, expected_flags, expected_effective):
    features = {"version": version, "flags": rc.parse_checkpoint_help(recorded("checkpoint-help", version))}
    flags, effective = rc.checkpoint_flags(features, compression, direct, ["--cuda-checkpoint-path=/usr/bin/x"])
    assert flags == expected_flags + ["--cuda-checkpoint-path=/usr/bin/x"]
    assert effective == expected_effective


@pytest.mark.parametrize("version,written,compression,expected", [
    (NEW, ["--compression=none", "--direct"], "none", ["--direct"]),  # read as it was written
    (NEW, ["--compression=none"], "none", []),  # the 2024 build has no -background
    (OLD, ["--direct"], "flate-best-speed", []),  # the 2022 restore has no -direct
    (SOURCE_2026, ["--compression=none", "--direct"], "none", ["--direct", "--background"]),
    (SOURCE_2026, ["--compression=flate-best-speed"], "flate-best-speed", []),  # background needs uncompressed
])
def test_restore_reads_with_o_direct_what_was_written_with_it(version, written, compression, expected):
    features = {"version": version, "restore_flags": rc.parse_checkpoint_help(recorded("restore-help", version))}
    manifest = {"runsc": {"checkpoint_flags": written, "image_compression": compression}}
    assert rc.restore_flags(features, manifest) == expected
    assert rc.restore_flags(None, manifest) == [] and rc.restore_flags(features, None) == []
    assert rc.restore_argv(["runsc"], "/img", "/b", "c", expected) == \
        ["runsc", "restore", *expected, "--image-path", "/img", "--bundle", "/b", "c"]


def test_a_cache_written_before_restore_flags_were_read_is_refreshed(tmp_path):
    rc._memo.clear()
    binary, calls = fake_runsc(tmp_path, NEW)
    cache = tmp_path / "cache"
    features = rc.checkpoint_features(binary, str(cache))
    old = dict(features)
    del old["restore_flags"]
    (cache / rc.FEATURES_CACHE).write_text(json.dumps(old))
    rc._memo.clear()
    assert rc.checkpoint_features(binary, str(cache))["restore_flags"] == features["restore_flags"]
    assert len(calls.read_text().split()) == 6


def test_unknown_compression_is_refused_with_the_choices():
    features = {"version": NEW, "flags": rc.parse_checkpoint_help(recorded("checkpoint-help", NEW))}
    with pytest.raises(CheckpointError, match="none, flate-best-speed"):
        rc.checkpoint_flags(features, "zstd")


def test_compression_a_runsc_does_not_list_is_refused():
    features = {"version": "future", "flags": {"compression": {"type": "value", "values": ["none", "zstd"],
                                                               "default": "zstd"}}}
    with pytest.raises(CheckpointError, match="runsc future cannot write.*flate-best-speed.*none\\|zstd"):
        rc.checkpoint_flags(features, "flate-best-speed")


def test_store_accepts_exactly_the_runsc_compressions(tmp_path):
    assert IMAGE_COMPRESSIONS == ("none", "flate-best-speed")
    assert CheckpointStore(str(tmp_path), compression="flate-best-speed").compression == "flate-best-speed"
    with pytest.raises(CheckpointError, match="one of: none, flate-best-speed"):
        CheckpointStore(str(tmp_path), compression="gzip")


def test_site_model_accepts_flate_best_speed_and_refuses_others():
    from pydantic import ValidationError

    from slurmbox.settings.model import CheckpointStoreModel

    assert CheckpointStoreModel(compression="flate-best-speed").compression == "flate-best-speed"
    assert CheckpointStoreModel().compression == "none"
    with pytest.raises(ValidationError, match="knows only none and flate-best-speed"):
        CheckpointStoreModel(compression="zstd")


def test_features_are_detected_once_per_binary_and_cached(tmp_path):
    rc._memo.clear()
    binary, calls = fake_runsc(tmp_path, NEW)
    cache = tmp_path / "cache"
    features = rc.checkpoint_features(binary, str(cache))
    assert features["version"] == "0.0~20240729.0"
    assert features["flags"]["compression"]["values"] == ["none", "flate-best-speed"]
    assert features["restore_flags"]["direct"]["type"] == "bool"
    assert len(calls.read_text().split()) == 3  # checkpoint --help, restore --help and --version
    rc._memo.clear()  # a new process: the file cache answers
    assert rc.checkpoint_features(binary, str(cache)) == features
    assert len(calls.read_text().split()) == 3
    with open(cache / rc.FEATURES_CACHE) as handle:
        assert json.load(handle)["key"].startswith(binary + ":")


def test_cache_is_invalidated_when_the_binary_changes(tmp_path):
    rc._memo.clear()
    binary, calls = fake_runsc(tmp_path, OLD)
    cache = str(tmp_path / "cache")
    assert "compression" not in rc.checkpoint_features(binary, cache)["flags"]
    # The node's runsc is upgraded in place (Debian 12 -> 13): a different size and mtime.
    with open(binary, "a") as handle:
        handle.write("# upgraded\n")
    os.utime(binary, ns=(1, 1))
    (tmp_path / ("bin-%s" % OLD) / "help.txt").write_text(recorded("checkpoint-help", NEW))
    rc._memo.clear()
    assert rc.checkpoint_features(binary, cache)["flags"]["compression"]["default"] == "flate-best-speed"
    assert len(calls.read_text().split()) == 6


def test_missing_binary_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="cannot read the runsc binary"):
        rc.checkpoint_features(str(tmp_path / "nope"))


def test_checkpoint_argv_order():
    assert rc.checkpoint_argv(["runsc", "--root", "/r"], "/img", "cid", ["--compression=none"]) == [
        "runsc", "--root", "/r", "checkpoint", "--compression=none", "--image-path", "/img", "cid"]


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the checkpoint store must be root-owned")


def _store(tmp_path, compression="none"):
    root = tmp_path / "store"
    root.mkdir(mode=0o755, exist_ok=True)
    return CheckpointStore(str(root), compression=compression)


@needs_root
@pytest.mark.parametrize("version,compression,direct_ok,argv_flags,recorded_compression", [
    (OLD, "none", True, [], "flate-best-speed"),
    (NEW, "none", True, ["--compression=none", "--direct"], "none"),
    (NEW, "none", False, ["--compression=none"], "none"),  # the store's file system refuses O_DIRECT
    (NEW, "flate-best-speed", True, ["--compression=flate-best-speed", "--direct"], "flate-best-speed"),
])
def test_checkpoint_sandbox_passes_the_flags_and_records_them(tmp_path, monkeypatch, version, compression, direct_ok,
                                                              argv_flags, recorded_compression):
    from slurmbox.migrate.store import PendingCheckpoint

    rc._memo.clear()
    monkeypatch.setattr(PendingCheckpoint, "direct_io_ok", lambda self: direct_ok)
    binary, _calls = fake_runsc(tmp_path, version)
    store = _store(tmp_path, compression)
    pending = store.begin("5", "batch", os.getuid())
    ckpt, _took = rc.checkpoint_sandbox([binary, "--root", "/x"], "cid", pending, {"reason": "unit"},
                                        {"mounts": []}, cache_dir=str(tmp_path / "cache"))
    with open(os.path.join(ckpt.path, "checkpoint.img")) as handle:
        assert handle.read().split() == ["--root", "/x", "checkpoint", *argv_flags, "--image-path",
                                         pending.image_dir, "cid"]
    described = ckpt.manifest["runsc"]
    assert described["binary"] == binary and described["flags"] == ["--root", "/x"]
    assert described["checkpoint_flags"] == argv_flags
    assert described["image_compression"] == recorded_compression
    assert described["version"] == recorded("version", version).splitlines()[0].replace("runsc version ", "")
    assert store.verify(ckpt).valid


@needs_root
def test_checkpoint_sandbox_without_direct_when_asked(tmp_path):
    rc._memo.clear()
    binary, _calls = fake_runsc(tmp_path, NEW)
    store = _store(tmp_path)
    ckpt, _took = rc.checkpoint_sandbox([binary], "cid", store.begin("6", "batch", os.getuid()), {}, None,
                                        direct=False)
    assert ckpt.manifest["runsc"]["checkpoint_flags"] == ["--compression=none"]


@needs_root
def test_direct_io_probe_leaves_nothing_behind(tmp_path):
    pending = _store(tmp_path).begin("7", "batch", os.getuid())
    assert pending.direct_io_ok() is True  # ext4 and tmpfs (Linux >= 6.6) take O_DIRECT
    assert os.listdir(pending.image_dir) == []


@needs_root
def test_publish_flushes_and_hashes_every_file(tmp_path, monkeypatch):
    import hashlib

    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink("/proc/self/fd/%d" % fd))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store = _store(tmp_path)
    pending = store.begin("8", "batch", os.getuid())
    blobs = {"checkpoint.img": os.urandom(5000), "pages.img": os.urandom(3 << 20), "pages_meta.img": b"m"}
    for name, blob in blobs.items():
        with open(os.path.join(pending.image_dir, name), "wb") as handle:
            handle.write(blob)
    ckpt = pending.publish({})
    files = {f["name"]: f for f in ckpt.manifest["files"]}
    assert {n: (f["size"], f["chunk_sha256"]) for n, f in files.items()} == {  # each is one 32 MiB chunk
        n: (len(b), [hashlib.sha256(b).hexdigest()]) for n, b in blobs.items()}
    for name in blobs:  # flushed under its temporary name, before the rename
        assert os.path.join(pending.image_dir, name) in synced


@needs_root
def test_publish_failure_of_fsync_removes_the_partial_checkpoint(tmp_path, monkeypatch):
    import errno

    from slurmbox.migrate.store import StoreFull

    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    store = _store(tmp_path)
    pending = store.begin("9", "batch", os.getuid())
    with open(os.path.join(pending.image_dir, "pages.img"), "wb") as handle:
        handle.write(b"x" * 4096)
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StoreFull, match="is full"):
        pending.publish({})
    assert not os.path.exists(pending.image_dir) and store.checkpoints("9", "batch") == []


def test_restore_problem_names_both_versions():
    old = {"version": "0.0~20221219.0"}
    new = {"version": "0.0~20240729.0"}
    manifest = {"runsc": {"binary": "/usr/bin/runsc", "version": "0.0~20221219.0"}}
    assert rc.restore_problem(manifest, old) is None
    problem = rc.restore_problem(manifest, new)
    assert "written by runsc 0.0~20221219.0" in problem and "runsc 0.0~20240729.0 cannot restore it" in problem
    assert rc.restore_problem({"runsc": {"binary": "/usr/bin/runsc"}}, new) is None  # recorded before versions were
    assert rc.restore_problem(manifest, {"version": "unknown"}) is None


TRIXIE_RUNSC = "/tmp/runsc-trixie/x/usr/bin/runsc"  # Debian 13's runsc, extracted (never installed on PATH here)


def _installed_runsc():
    import shutil

    return shutil.which("runsc", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


@pytest.mark.parametrize("binary", [_installed_runsc(), TRIXIE_RUNSC], ids=["installed", "trixie"])
def test_real_runsc_help_parses_like_its_recording(binary):
    if not binary or not os.access(binary, os.X_OK):
        pytest.skip("no runsc at %s" % binary)
    rc._memo.clear()
    features = rc.checkpoint_features(binary)
    version = {"0.0~20221219.0": OLD, "0.0~20240729.0": NEW}.get(features["version"])
    if version is None:
        pytest.skip("runsc %s has no recording in tests/data/runsc" % features["version"])
    assert features["flags"] == rc.parse_checkpoint_help(recorded("checkpoint-help", version))


@needs_root
@pytest.mark.parametrize("binary", [_installed_runsc(), TRIXIE_RUNSC], ids=["installed", "trixie"])
def test_real_checkpoint_and_restore_continue_the_count(tmp_path, binary):
    """A sandbox counting on stdout is checkpointed through checkpoint_sandbox and restored: no gap, no repeat."""
    import subprocess
    import time

    from slurmbox.sandbox import runsc

    if not binary or not os.access(binary, os.X_OK):
        pytest.skip("no runsc at %s" % binary)
    rc._memo.clear()
    state = str(tmp_path / "state")
    caps = runsc.capabilities(binary, state)
    prefix = runsc.global_args(binary, os.path.join(state, "runsc"), runsc.choose_platform("auto", caps), "none")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = {"ociVersion": "1.0.0",
            "process": {"terminal": False, "user": {"uid": 65534, "gid": 65534}, "cwd": "/",
                        "args": ["/bin/sh", "-c", "i=0; while :; do i=$((i+1)); echo $i; sleep 0.02; done"],
                        "env": ["PATH=/usr/bin:/bin"]},
            "root": {"path": "/", "readonly": True}, "hostname": "t",
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"namespaces": [{"type": t} for t in ("pid", "mount", "ipc", "uts", "network")]}}
    (bundle / "config.json").write_text(json.dumps(spec))
    out = tmp_path / "count.out"
    cid = "sbxtest-%d" % os.getpid()
    store = _store(tmp_path)
    procs = []

    def count():
        return len(out.read_text().split())

    def wait_for(predicate, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return False

    try:
        with open(out, "a") as log:
            procs.append(subprocess.Popen(prefix + ["run", "--bundle", str(bundle), cid], stdin=subprocess.PIPE,
                                          stdout=log, stderr=subprocess.PIPE))
            assert wait_for(lambda: count() >= 10), "the sandbox did not start"
            probe = store.begin("4", "batch", 0)
            direct_ok = probe.direct_io_ok()
            probe.abort()
            ckpt, _took = rc.checkpoint_sandbox(prefix, cid, store.begin("4", "batch", 0), {"reason": "test"}, spec,
                                                cache_dir=state)
            assert procs[0].wait(timeout=60) is not None  # the checkpoint stopped the sandbox
            subprocess.run(prefix + ["delete", "--force", cid], capture_output=True)
            seen = count()
            features = rc.checkpoint_features(binary, state)
            described = ckpt.manifest["runsc"]
            assert described["version"] == features["version"]
            assert described["image_compression"] == ("none" if "compression" in features["flags"]
                                                      else "flate-best-speed")
            assert ("--direct" in described["checkpoint_flags"]) == ("direct" in features["flags"] and direct_ok)
            assert store.verify(ckpt).valid
            followed = (features["version"] in rc.SEQUENTIAL_IMAGE_WRITERS
                        and "--direct" not in described["checkpoint_flags"])
            assert described["image_digest"] == ("while-written" if followed else "read-back")
            procs.append(subprocess.Popen(rc.restore_argv(prefix, ckpt.path, str(bundle), cid),
                                          stdin=subprocess.PIPE, stdout=log, stderr=subprocess.PIPE))
            assert wait_for(lambda: count() >= seen + 10), "no output after restore"
        numbers = out.read_text().split()
        assert numbers == [str(i) for i in range(1, len(numbers) + 1)]
    finally:
        subprocess.run(prefix + ["kill", cid, "KILL"], capture_output=True)
        subprocess.run(prefix + ["delete", "--force", cid], capture_output=True)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
