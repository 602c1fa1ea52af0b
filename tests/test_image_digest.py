"""Chunked SHA-256 of checkpoint image files (slurmbox.migrate.image_digest) and verification against it."""

import errno
import hashlib
import json
import os
import subprocess
import sys

import pytest

from slurmbox.migrate import image_digest
from slurmbox.migrate.store import CheckpointError, CheckpointStore

MIB = 1 << 20
CHUNK = 8 * MIB  # the smallest chunk size digest_files takes (one read)


def _expected(blob, chunk=CHUNK):
    if not blob:
        return (hashlib.sha256(b"").hexdigest(),)
    return tuple(hashlib.sha256(blob[i:i + chunk]).hexdigest() for i in range(0, len(blob), chunk))


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("direct", [False, True])
def test_chunk_digests_are_sha256_of_each_byte_range(tmp_path, monkeypatch, direct, workers):
    sizes = [0, 1, 4096, 5000, CHUNK, CHUNK + 1, 2 * CHUNK + 123]
    blobs = [os.urandom(size) for size in sizes]
    paths = []
    for index, blob in enumerate(blobs):
        path = tmp_path / ("f%d.img" % index)
        path.write_bytes(blob)
        paths.append(str(path))
    real_open, opened = os.open, []
    monkeypatch.setattr(os, "open", lambda path, flags, *a: opened.append(flags) or real_open(path, flags, *a))
    digests = image_digest.digest_files(paths, chunk_bytes=CHUNK, direct=direct, workers=workers)
    # O_DIRECT is asked for exactly when wanted (a file system refusing it gets a plain open after it)
    assert sum(bool(flags & os.O_DIRECT) for flags in opened) == (len(paths) if direct else 0)
    assert [d.size for d in digests] == sizes
    assert [d.chunk_sha256 for d in digests] == [_expected(b) for b in blobs]
    assert [len(d.chunk_sha256) for d in digests] == [image_digest.chunk_count(s, CHUNK) for s in sizes]


def test_a_file_of_one_chunk_has_its_plain_sha256(tmp_path):
    blob = os.urandom(3 * MIB)
    path = tmp_path / "pages.img"
    path.write_bytes(blob)
    (digest,) = image_digest.digest_files([str(path)])
    assert digest.chunk_bytes == image_digest.CHUNK_BYTES
    assert digest.chunk_sha256 == (hashlib.sha256(blob).hexdigest(),)


def test_direct_reads_fall_back_where_o_direct_is_refused(tmp_path, monkeypatch):
    real_open = os.open
    refused = []

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    blob = b"abc" * 5000
    path = tmp_path / "pages.img"
    path.write_bytes(blob)
    (digest,) = image_digest.digest_files([str(path)], chunk_bytes=CHUNK, direct=True)
    assert refused == [str(path)] and digest.chunk_sha256 == _expected(blob)


def test_chunk_size_must_be_a_whole_number_of_reads(tmp_path):
    with pytest.raises(ValueError, match="multiple"):
        image_digest.digest_files([], chunk_bytes=CHUNK + 4096)


def test_first_mismatch_names_the_first_differing_chunk():
    digest = image_digest.FileDigest(3 * CHUNK, CHUNK, ("a", "b", "c"))
    assert digest.first_mismatch(["a", "b", "c"]) is None
    assert digest.first_mismatch(["a", "x", "y"]) == 1
    assert digest.first_mismatch(["a", "b"]) == 2
    assert digest.first_mismatch(["a", "b", "c", "d"]) == 3


def test_a_missing_file_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        image_digest.digest_files([str(tmp_path / "gone.img")])


# -- verification against the manifest --------------------------------------------------------------
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the store is root-owned; run as root")


def _published(tmp_path, blob):
    store = CheckpointStore(str(tmp_path / "store"), keep_last=3)
    pending = store.begin("11", "batch", os.getuid())
    with open(os.path.join(pending.image_dir, "pages.img"), "wb") as handle:
        handle.write(blob)
    return store, pending.publish({"node": "n1"}, {"ociVersion": "1.0.0"})


@needs_root
@pytest.mark.parametrize("direct", [False, True])
def test_a_flipped_byte_is_reported_with_its_chunk(tmp_path, direct):
    blob = os.urandom(image_digest.CHUNK_BYTES + 5 * MIB)  # two chunks
    store, ckpt = _published(tmp_path, blob)
    entry = next(f for f in ckpt.manifest["files"] if f["name"] == "pages.img")
    assert entry["chunk_sha256"] == list(_expected(blob, image_digest.CHUNK_BYTES))
    assert store.verify(ckpt, direct=direct).valid
    offset = image_digest.CHUNK_BYTES + 17  # in the second chunk
    with open(os.path.join(ckpt.path, "pages.img"), "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))
    problems = store.verify(ckpt, direct=direct).problems
    assert problems == ["pages.img sha256 mismatch in bytes %d-%d (corrupted)"
                        % (image_digest.CHUNK_BYTES, len(blob) - 1)]


@needs_root
def test_a_truncated_file_is_reported_by_size(tmp_path):
    store, ckpt = _published(tmp_path, os.urandom(2 * MIB))
    os.truncate(os.path.join(ckpt.path, "pages.img"), MIB)
    assert store.verify(ckpt).problems == ["pages.img has %d bytes, manifest says %d (truncated or grown)"
                                           % (MIB, 2 * MIB)]


@needs_root
def test_a_manifest_without_a_usable_chunk_size_is_invalid(tmp_path):
    store, ckpt = _published(tmp_path, b"x" * 100)
    ckpt.manifest["chunk_bytes"] = 1000
    assert store.verify(ckpt).problems == ["manifest has no usable chunk_bytes (1000)"]


@needs_root
def test_format_1_manifests_with_whole_file_sha256_still_verify(tmp_path):
    """Checkpoints written before chunked digests (manifest format 1) are still restored, and still checked."""
    blob = os.urandom(MIB)
    store, ckpt = _published(tmp_path, blob)
    manifest_path = os.path.join(ckpt.path, "manifest.json")
    with open(manifest_path) as handle:
        manifest = json.load(handle)
    manifest["format"] = 1
    del manifest["chunk_bytes"]
    for entry in manifest["files"]:
        entry["sha256"] = entry.pop("chunk_sha256")[0]
    with open(manifest_path, "w") as handle:
        json.dump(manifest, handle)
    old = store.get("11", "batch", ckpt.name)
    assert old.manifest["format"] == 1 and store.verify(old).valid
    with open(os.path.join(ckpt.path, "pages.img"), "r+b") as handle:
        handle.write(b"\0")
    assert store.verify(old).problems == ["pages.img sha256 mismatch (corrupted)"]


# -- hashing while a writer appends (ImageFollower) ---------------------------------------------------
def _append(path, blob):
    with open(path, "ab") as handle:
        handle.write(blob)


def test_follower_digests_equal_a_read_back_whatever_the_cut_points(tmp_path):
    """Passes between appends stand for the follower thread waking while runsc writes."""
    follower = image_digest.ImageFollower(str(tmp_path), chunk_bytes=CHUNK)
    blobs = {"pages.img": os.urandom(2 * CHUNK + 3 * MIB + 5), "checkpoint.img": os.urandom(700_001),
             "empty.img": b""}
    cuts = {"pages.img": [1, MIB - 3, CHUNK + 1, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + MIB],
            "checkpoint.img": [4096, 300_000]}
    written = {name: 0 for name in blobs}
    for name in blobs:
        (tmp_path / name).write_bytes(b"")
    follower._pass()
    for round_ in range(len(cuts["pages.img"])):
        for name, points in cuts.items():
            if round_ < len(points):
                _append(tmp_path / name, blobs[name][written[name]:points[round_]])
                written[name] = points[round_]
        follower._pass()
    assert follower.files["pages.img"].offset > CHUNK  # it did read as the file grew
    for name, blob in blobs.items():
        _append(tmp_path / name, blob[written[name]:])
    result = follower.finish()
    expected = dict(zip(sorted(blobs), image_digest.digest_files([str(tmp_path / n) for n in sorted(blobs)],
                                                                 chunk_bytes=CHUNK)))
    assert result == expected
    assert result["pages.img"].chunk_sha256 == _expected(blobs["pages.img"])


def test_follower_thread_hashes_a_file_written_by_another_process(tmp_path):
    blob = os.urandom(3 * CHUNK + 12345)
    follower = image_digest.ImageFollower(str(tmp_path), chunk_bytes=CHUNK)
    follower.start()
    writer = subprocess.run([sys.executable, "-c", "import sys\nwith open(sys.argv[1], 'wb') as f:\n"
                             "    data = sys.stdin.buffer.read()\n"
                             "    for i in range(0, len(data), 65536):\n        f.write(data[i:i + 65536])\n",
                             str(tmp_path / "pages.img")], input=blob, check=True)
    assert writer.returncode == 0
    assert follower.finish() == {"pages.img": image_digest.FileDigest(len(blob), CHUNK, _expected(blob))}


def test_follower_leaves_out_files_replaced_or_shrunk_after_it_read_them(tmp_path):
    follower = image_digest.ImageFollower(str(tmp_path), chunk_bytes=CHUNK)
    for name in ("replaced.img", "shrunk.img", "kept.img"):
        (tmp_path / name).write_bytes(os.urandom(2 * MIB))
    follower._pass()
    (tmp_path / "other").write_bytes(b"new contents")
    os.replace(tmp_path / "other", tmp_path / "replaced.img")
    os.truncate(tmp_path / "shrunk.img", MIB)
    result = follower.finish()
    assert sorted(result) == ["kept.img"]


def test_follower_ignores_hidden_files_links_and_directories(tmp_path):
    (tmp_path / ".direct-probe").write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "image.img").write_bytes(b"abc")
    os.symlink(tmp_path / "image.img", tmp_path / "link.img")
    follower = image_digest.ImageFollower(str(tmp_path), chunk_bytes=CHUNK)
    assert sorted(follower.finish()) == ["image.img"]


def test_stopped_follower_closes_its_files(tmp_path):
    (tmp_path / "image.img").write_bytes(b"abc")
    before = set(os.listdir("/proc/self/fd"))
    follower = image_digest.ImageFollower(str(tmp_path), chunk_bytes=CHUNK)
    follower._pass()
    assert "image.img" in follower.files
    follower.stop()
    assert follower.files == {}
    assert set(os.listdir("/proc/self/fd")) <= before


def test_short_reads_in_the_middle_of_a_file_are_read_on(tmp_path, monkeypatch):
    """NFS and FUSE may return less than asked before the end of the file: that is not the file's end."""
    real = os.preadv

    def half(fd, buffers, offset):
        (view,) = buffers
        return real(fd, [view[:max(4096, len(view) // 2)]], offset)

    monkeypatch.setattr(os, "preadv", half)
    blob = os.urandom(2 * CHUNK + 777)
    path = tmp_path / "pages.img"
    path.write_bytes(blob)
    (digest,) = image_digest.digest_files([str(path)], chunk_bytes=CHUNK)
    assert digest.size == len(blob) and digest.chunk_sha256 == _expected(blob)


def test_workers_default_to_the_cpus_but_at_most_max_workers(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(192)))
    assert image_digest._default_workers() == image_digest.MAX_WORKERS
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert image_digest._default_workers() == 1


@needs_root
def test_a_manifest_whose_chunk_list_does_not_fit_the_size_is_reported_as_such(tmp_path):
    store, ckpt = _published(tmp_path, os.urandom(MIB))
    entry = next(f for f in ckpt.manifest["files"] if f["name"] == "pages.img")
    entry["chunk_sha256"].append(entry["chunk_sha256"][0])
    assert store.verify(ckpt).problems == ["pages.img: the manifest lists 2 chunk digests for %d bytes, not 1 "
                                           "(corrupted manifest)" % MIB]


@needs_root
def test_an_unreadable_image_is_named(tmp_path, monkeypatch):
    store, ckpt = _published(tmp_path, os.urandom(MIB))

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", os.path.join(ckpt.path, "pages.img"))

    monkeypatch.setattr(image_digest, "digest_files", refuse)
    (problem,) = store.verify(ckpt).problems
    assert problem == "image files unreadable (Permission denied: %s)" % os.path.join(ckpt.path, "pages.img")


@needs_root
def test_a_file_that_grows_while_it_is_hashed_is_not_published(tmp_path, monkeypatch):
    store = CheckpointStore(str(tmp_path / "store"), keep_last=3)
    pending = store.begin("12", "batch", os.getuid())
    image = os.path.join(pending.image_dir, "pages.img")
    with open(image, "wb") as handle:
        handle.write(os.urandom(MIB))
    real = image_digest.digest_files

    def grow_while_reading(paths, *args, **kwargs):
        result = real(paths, *args, **kwargs)
        with open(image, "ab") as handle:  # a writer still appending after the read
            handle.write(b"late")
        return result

    monkeypatch.setattr(image_digest, "digest_files", grow_while_reading)
    with pytest.raises(CheckpointError, match="pages.img changed while it was hashed .%d bytes read, %d now"
                       % (MIB, MIB + 4)):
        pending.publish({"node": "n1"})
    assert store.checkpoints("12", "batch") == [] and not os.path.exists(pending.image_dir)
