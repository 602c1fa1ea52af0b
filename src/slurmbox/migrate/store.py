"""The checkpoint store: checkpoint images of sandboxes, with manifests, published atomically.

Layout under the store root (a directory on a file system every node sees)::

    <root>/                         root, 0755
      <job>/                        root, 0700 + ACL: the job's user may read
        <step>/                     e.g. "batch"
          .lock                     serialises writers of this step
          .tmp-<seq>-<pid>-<rand>/  a checkpoint being written (never read)
          ckpt-<seq>/               a published checkpoint
            checkpoint.img ...      files written by ``runsc checkpoint``
            spec.json               the OCI spec the sandbox ran with
            manifest.json           written last (see MANIFEST_FORMAT)

A checkpoint is published by writing every file into the temporary
directory, fsync()ing each file, writing ``manifest.json`` (files with sizes
and SHA-256 digests), fsync()ing the directory, renaming it to ``ckpt-<seq>`` and
fsync()ing the parent: rename(2) is atomic, so a writer killed halfway leaves
only a ``.tmp-*`` directory, which readers ignore and ``gc`` removes. Only
root writes; the job's user may read (slurmbox.migrate.acl).

Standard library only: the supervisor imports this on the step start path.
"""

import errno
import fcntl
import hashlib
import json
import mmap
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field

from slurmbox.migrate import acl, image_digest

#: Manifest format version written by this module: 2 records each file's ``chunk_sha256``
#: (slurmbox.migrate.image_digest) and the manifest's ``chunk_bytes``; 1 recorded one
#: whole-file ``sha256`` per file. Both are read and verified.
MANIFEST_FORMAT = 2
READABLE_FORMATS = (1, 2)
MANIFEST = "manifest.json"
SPEC = "spec.json"
_CKPT = re.compile(r"^ckpt-(\d{6,})$")
_TMP = re.compile(r"^\.tmp-(\d{6,})-(\d+)-[0-9a-f]+$")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
#: Image compressions of ``runsc checkpoint -compression`` (gVisor pkg/state/statefile:
#: "none" and "flate-best-speed"), the values of checkpoint_store.compression.
IMAGE_COMPRESSIONS = ("none", "flate-best-speed")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says what and what to do."""


class StoreFull(CheckpointError):
    """The store's file system has too little free space (or ran out while writing)."""


@dataclass
class Checkpoint:
    """One published checkpoint: ``job``, ``step``, ``name`` (``ckpt-NNNNNN``), ``seq`` (int),
    ``path`` and its ``manifest`` (dict, or None when missing or unreadable)."""

    job: str
    step: str
    name: str
    seq: int
    path: str
    manifest: dict = None
    manifest_error: str = ""

    def summary(self):
        """JSON-ready dict for ``slurmbox checkpoint ls``."""
        m = self.manifest or {}
        return {"job": self.job, "step": self.step, "name": self.name, "path": self.path,
                "node": m.get("node"), "time": m.get("time"), "reason": m.get("reason"),
                "parent": m.get("parent"), "bytes": sum(f.get("size", 0) for f in m.get("files", [])),
                "manifest": "ok" if self.manifest else (self.manifest_error or "missing")}


@dataclass
class Verification:
    """Outcome of verifying a checkpoint: ``problems`` (list of str; empty means valid)."""

    checkpoint: Checkpoint
    problems: list = field(default_factory=list)

    @property
    def valid(self):
        return not self.problems


def _check_name(kind, value):
    value = str(value)
    if not _NAME.match(value) or value in (".", ".."):
        raise CheckpointError("%s %r is not a valid name (letters, digits, '_.+-', at most 64)" % (kind, value))
    return value


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path, fsync=False):
    """(size in bytes, sha256 hex) of the whole file at ``path``; with ``fsync`` also flush it to disk.

    Raises OSError when the file cannot be read.
    """
    with open(path, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
        if fsync:
            os.fsync(handle.fileno())
        return handle.tell(), digest


class _Syncer:
    """fsync(2) ``paths`` one after the other in a thread; ``wait`` re-raises its first OSError."""

    def __init__(self, paths):
        self.paths, self.error, self.stopped = paths, None, False
        self.thread = threading.Thread(target=self._run, name="checkpoint-fsync", daemon=True)
        self.thread.start()

    def _run(self):
        for path in self.paths:
            if self.stopped:
                return
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as err:
                self.error = err
                return

    def wait(self):
        """Block until every file is flushed; raises the OSError of a failed fsync."""
        self.thread.join()
        if self.error is not None:
            raise self.error

    def stop(self):
        """Give up (publish failed): flush no further file, wait for the one in progress."""
        self.stopped = True
        self.thread.join()


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PendingCheckpoint:
    """A checkpoint being written into ``image_dir`` (a ``.tmp-*`` directory).

    Give ``image_dir`` to ``runsc checkpoint --image-path``, then call
    ``publish`` (or ``abort`` on failure). Not thread-safe.
    """

    def __init__(self, store, job, step, seq, image_dir, uid, parent):
        self.store, self.job, self.step, self.seq = store, job, step, seq
        self.image_dir, self.uid, self.parent = image_dir, uid, parent
        self.done = False

    def direct_io_ok(self):
        """Whether ``image_dir``'s file system takes O_DIRECT writes (open(2) O_DIRECT; tmpfs and some
        FUSE file systems refuse them with EINVAL), probed with one aligned 4 KiB block. Returns bool."""
        probe = os.path.join(self.image_dir, ".direct-probe")
        block = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT requires
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_DIRECT, 0o600)
            try:
                return os.write(fd, block) == 4096
            finally:
                os.close(fd)
        except OSError:
            return False
        finally:
            block.close()
            try:
                os.unlink(probe)
            except OSError:
                pass

    def publish(self, manifest_fields, spec=None, direct_read=False, digests=None):
        """Hash, fsync and atomically publish the files in ``image_dir``.

        ``manifest_fields``: dict merged into the manifest (node, runsc,
        reason, ...); ``spec``: the OCI spec (dict) saved as ``spec.json``,
        whose sha256 is recorded as ``spec_sha256``; ``direct_read``: read
        the files back with O_DIRECT (runsc wrote them with O_DIRECT: right
        after such a write, O_DIRECT reads were ~20% faster here than
        page-cache reads, benchmarks/checkpoint_throughput.py). Each file's ``size`` and
        ``chunk_sha256`` (slurmbox.migrate.image_digest) go in the manifest;
        ``digests``: ``{name: FileDigest}`` already taken while the files
        were written (image_digest.ImageFollower), used where its size is
        the file's size now; the other files are read back and hashed.
        Returns the Checkpoint.
        Raises StoreFull when the file system is out of space (the partial
        checkpoint is removed) and CheckpointError for other failures.
        """
        syncer = None
        try:
            if spec is not None:
                spec_bytes = json.dumps(spec, sort_keys=True).encode()
                self._write(os.path.join(self.image_dir, SPEC), spec_bytes)
            names = [name for name in sorted(os.listdir(self.image_dir)) if name != MANIFEST
                     and os.path.isfile(os.path.join(self.image_dir, name))
                     and not os.path.islink(os.path.join(self.image_dir, name))]
            paths = {name: os.path.join(self.image_dir, name) for name in names}
            # Flush the files to disk while hashing them: fsync(2) waits on the disk, hashing on the CPUs.
            syncer = _Syncer(list(paths.values()))
            sizes = {name: os.path.getsize(path) for name, path in paths.items()}
            known = {name: digest for name, digest in (digests or {}).items()
                     if digest.chunk_bytes == image_digest.CHUNK_BYTES and sizes.get(name) == digest.size}
            unknown = [name for name in names if name not in known]
            known.update(zip(unknown, image_digest.digest_files([paths[name] for name in unknown],
                                                                direct=direct_read)))
            for name in names:
                now = os.path.getsize(paths[name])
                if now != known[name].size:
                    raise CheckpointError("%s changed while it was hashed (%d bytes read, %d now); was runsc "
                                          "still writing it?" % (name, known[name].size, now))
            files = [{"name": name, "size": known[name].size, "chunk_sha256": list(known[name].chunk_sha256)}
                     for name in names]
            for path in paths.values():
                self.store.restrict(path, self.uid)
            syncer.wait()
            if not any(f["name"] != SPEC for f in files):
                raise CheckpointError("runsc wrote no image files into %s" % self.image_dir)
            manifest = {"format": MANIFEST_FORMAT, "job": self.job, "step": self.step, "seq": self.seq,
                        "uid": self.uid, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "unix_time": time.time(), "parent": self.parent, "files": files,
                        "chunk_bytes": image_digest.CHUNK_BYTES}
            if spec is not None:
                manifest["spec_sha256"] = hashlib.sha256(spec_bytes).hexdigest()
            for key, value in manifest_fields.items():
                manifest.setdefault(key, value)
            manifest_path = os.path.join(self.image_dir, MANIFEST)
            self._write(manifest_path, json.dumps(manifest, indent=1, sort_keys=True).encode())
            self.store.restrict(manifest_path, self.uid)
            self.store.restrict(self.image_dir, self.uid)
            _fsync_dir(self.image_dir)
            final = os.path.join(os.path.dirname(self.image_dir), "ckpt-%06d" % self.seq)
            os.rename(self.image_dir, final)
            _fsync_dir(os.path.dirname(final))
        except OSError as err:
            if syncer is not None:
                syncer.stop()
            self.abort()
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFull("the checkpoint store %s is full (%s); free space or raise its quota. The "
                                "previous checkpoint, if any, is unchanged" % (self.store.root, err.strerror))
            raise CheckpointError("cannot publish checkpoint in %s: %s" % (self.image_dir, err))
        except CheckpointError:
            if syncer is not None:
                syncer.stop()
            self.abort()
            raise
        self.done = True
        self.store.prune(self.job, self.step)
        return self.store.get(self.job, self.step, "ckpt-%06d" % self.seq)

    @staticmethod
    def _write(path, data):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def abort(self):
        """Remove the partial checkpoint (idempotent)."""
        if not self.done:
            shutil.rmtree(self.image_dir, ignore_errors=True)
            self.done = True


class CheckpointStore:
    """The store rooted at ``root`` (see module docstring).

    ``keep_last``: published checkpoints kept per step (>= 1);
    ``compression``: the image compression asked of ``runsc checkpoint``, one
    of IMAGE_COMPRESSIONS (see slurmbox.migrate.runsc_checkpoint: runsc
    builds without a ``-compression`` flag always write flate);
    ``min_free_mb``: refuse to start a checkpoint with less free space.
    Raises CheckpointError for any other compression or keep_last < 1.
    """

    def __init__(self, root, keep_last=2, compression="none", min_free_mb=0):
        if compression not in IMAGE_COMPRESSIONS:
            raise CheckpointError("checkpoint_store.compression=%r is not supported; use one of: %s"
                                  % (compression, ", ".join(IMAGE_COMPRESSIONS)))
        if int(keep_last) < 1:
            raise CheckpointError("checkpoint_store.keep_last must be at least 1, not %r" % keep_last)
        self.root = os.path.abspath(root)
        self.keep_last = int(keep_last)
        self.compression = compression
        self.min_free_mb = int(min_free_mb or 0)
        self.warnings = []

    # -- paths -----------------------------------------------------------------------------
    def job_dir(self, job):
        """Directory of job ``job``'s checkpoints."""
        return os.path.join(self.root, _check_name("job", job))

    def step_dir(self, job, step):
        """Directory of the checkpoints of step ``step`` of job ``job``."""
        return os.path.join(self.job_dir(job), _check_name("step", step))

    def _ensure_dirs(self, job, step, uid):
        if not os.path.isdir(self.root):
            os.makedirs(self.root, 0o755, exist_ok=True)
        info = os.lstat(self.root)
        if info.st_uid != 0 or info.st_mode & 0o022 or not os.path.isdir(self.root) or os.path.islink(self.root):
            raise CheckpointError("checkpoint store %s must be a directory owned by root and writable only by "
                                  "root" % self.root)
        for path in (self.job_dir(job), self.step_dir(job, step)):
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                if os.path.islink(path) or os.lstat(path).st_uid != 0:
                    raise CheckpointError("%s is not a root-owned directory; remove it" % path)
            self.restrict(path, uid)

    def write_private(self, job, step, name, data, uid):
        """Write ``data`` (bytes) as file ``name`` in (``job``, ``step``)'s directory, readable by root only.

        For coordination files (a name starting with "." is never listed as
        a checkpoint or step). Written to a temporary name, fsync()ed and
        renamed. Raises CheckpointError for a bad name or store, OSError when
        the file cannot be written.
        """
        if not name.startswith(".") or "/" in name or name in (".", "..") or name.startswith(".tmp-"):
            raise CheckpointError("coordination file name %r must start with '.' and be a plain name" % name)
        self._ensure_dirs(job, step, uid)
        path = os.path.join(self.step_dir(job, step), name)
        tmp = "%s.%d.%s" % (path, os.getpid(), os.urandom(4).hex())
        try:
            PendingCheckpoint._write(tmp, data)
            os.replace(tmp, path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path

    def restrict(self, path, uid):
        """Root plus user ``uid`` (read only) on ``path``; on a file system without ACLs,
        root only, with the reason kept in ``self.warnings``."""
        try:
            acl.restrict_to(path, uid)
        except acl.AclUnsupported as err:
            if str(err) not in self.warnings:
                self.warnings.append(str(err))

    def free_mb(self):
        """Free space of the store's file system in MiB (statvfs f_bavail)."""
        probe = self.root if os.path.isdir(self.root) else os.path.dirname(self.root)
        stat = os.statvfs(probe)
        return stat.f_bavail * stat.f_frsize / (1 << 20)

    # -- writing ---------------------------------------------------------------------------
    def begin(self, job, step, uid):
        """Start a checkpoint of (``job``, ``step``) for user ``uid``: returns a PendingCheckpoint.

        Raises StoreFull below ``min_free_mb`` and CheckpointError when the
        store is unusable (not root-owned, not writable).
        """
        job, step = _check_name("job", job), _check_name("step", step)
        try:
            self._ensure_dirs(job, step, int(uid))
        except OSError as err:
            raise CheckpointError("cannot create the checkpoint directory under %s: %s" % (self.root, err))
        if self.min_free_mb and self.free_mb() < self.min_free_mb:
            raise StoreFull("the checkpoint store %s has %.0f MiB free, below the site's min_free_mb=%d"
                            % (self.root, self.free_mb(), self.min_free_mb))
        step_dir = self.step_dir(job, step)
        with open(os.path.join(step_dir, ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            seqs = [int(m.group(1)) for m in map(lambda n: _CKPT.match(n) or _TMP.match(n), os.listdir(step_dir)) if m]
            seq = max(seqs, default=0) + 1
            image_dir = os.path.join(step_dir, ".tmp-%06d-%d-%s" % (seq, os.getpid(), os.urandom(4).hex()))
            os.mkdir(image_dir, 0o700)
        published = self.checkpoints(job, step)
        parent = published[0].name if published else None
        return PendingCheckpoint(self, job, step, seq, image_dir, int(uid), parent)

    # -- reading ---------------------------------------------------------------------------
    def get(self, job, step, name):
        """The Checkpoint ``name`` of (``job``, ``step``), manifest loaded (None if missing/bad)."""
        match = _CKPT.match(name)
        if not match:
            raise CheckpointError("%r is not a checkpoint name (ckpt-NNNNNN)" % name)
        path = os.path.join(self.step_dir(job, step), name)
        ckpt = Checkpoint(str(job), str(step), name, int(match.group(1)), path)
        try:
            with open(os.path.join(path, MANIFEST)) as handle:
                manifest = json.load(handle)
            if not isinstance(manifest, dict) or manifest.get("format") not in READABLE_FORMATS:
                ckpt.manifest_error = "unknown manifest format"
            else:
                ckpt.manifest = manifest
        except FileNotFoundError:
            ckpt.manifest_error = "missing manifest"
        except PermissionError:
            ckpt.manifest_error = "permission denied"
        except (OSError, ValueError) as err:
            ckpt.manifest_error = "unreadable manifest (%s)" % err
        return ckpt

    def checkpoints(self, job, step):
        """Published checkpoints of (``job``, ``step``), newest first. Temporary directories are skipped.

        Raises PermissionError when the caller may not read the job's directory.
        """
        try:
            names = os.listdir(self.step_dir(job, step))
        except FileNotFoundError:
            return []
        found = sorted((n for n in names if _CKPT.match(n)), key=lambda n: int(_CKPT.match(n).group(1)),
                       reverse=True)
        return [self.get(job, step, name) for name in found]

    def jobs(self):
        """Job names with a directory in the store (sorted numerically where possible)."""
        try:
            names = [n for n in os.listdir(self.root) if _NAME.match(n)]
        except FileNotFoundError:
            return []
        return sorted(names, key=lambda n: (0, int(n)) if n.isdigit() else (1, n))

    def steps(self, job):
        """Step names of ``job`` that have a directory in the store."""
        try:
            return sorted(n for n in os.listdir(self.job_dir(job)) if _NAME.match(n))
        except FileNotFoundError:
            return []

    def verify(self, ckpt, uid=None, direct=False):
        """Check ``ckpt`` against its manifest: job/step/uid, every file's size and SHA-256 digests.

        ``uid``: when given, the manifest's user must match (a checkpoint of a
        job id reused by another user is never restored). ``direct``: read
        the files with O_DIRECT (for a restore that reads them with O_DIRECT
        too; otherwise these reads leave the image in the page cache for it).
        Files of a format-2 manifest are hashed chunk by chunk on every CPU
        (slurmbox.migrate.image_digest); a mismatch names the bad byte range.
        Returns a Verification.
        """
        result = Verification(ckpt)
        manifest = ckpt.manifest
        if manifest is None:
            result.problems.append(ckpt.manifest_error or "missing manifest")
            return result
        if str(manifest.get("job")) != ckpt.job or str(manifest.get("step")) != ckpt.step:
            result.problems.append("manifest names job %s step %s" % (manifest.get("job"), manifest.get("step")))
        if uid is not None and manifest.get("uid") != uid:
            result.problems.append("written for uid %s, not %s" % (manifest.get("uid"), uid))
        files = manifest.get("files") or []
        if not files:
            result.problems.append("manifest lists no files")
        chunked = []
        for entry in files:
            name = str(entry.get("name", ""))
            path = os.path.join(ckpt.path, name)
            if "/" in name or name in ("", ".", "..") or not os.path.isfile(path):
                result.problems.append("%s is missing" % name)
            elif isinstance(entry.get("chunk_sha256"), list):
                chunked.append((name, path, entry))
            else:
                self._verify_whole(result, name, path, entry)
        if chunked:
            self._verify_chunked(result, manifest, chunked, direct)
        return result

    @staticmethod
    def _verify_whole(result, name, path, entry):
        """Format 1: one sha256 of the whole file."""
        try:
            size, digest = file_sha256(path)
        except OSError as err:
            result.problems.append("%s unreadable (%s)" % (name, err.strerror))
            return
        if size != entry.get("size"):
            result.problems.append("%s has %d bytes, manifest says %s (truncated or grown)"
                                   % (name, size, entry.get("size")))
        elif digest != entry.get("sha256"):
            result.problems.append("%s sha256 mismatch (corrupted)" % name)

    @staticmethod
    def _verify_chunked(result, manifest, chunked, direct):
        """Format 2: ``chunk_sha256`` of every file, hashed together on every CPU."""
        chunk_bytes = manifest.get("chunk_bytes")
        if not isinstance(chunk_bytes, int) or chunk_bytes <= 0 or chunk_bytes % image_digest.READ_BYTES:
            result.problems.append("manifest has no usable chunk_bytes (%r)" % (chunk_bytes,))
            return
        try:
            digests = image_digest.digest_files([path for _, path, _ in chunked], chunk_bytes, direct=direct)
        except OSError as err:
            result.problems.append("image files unreadable (%s%s)" % (err.strerror or err,
                                                                       ": %s" % err.filename if err.filename else ""))
            return
        for (name, _, entry), digest in zip(chunked, digests):
            if digest.size != entry.get("size"):
                result.problems.append("%s has %d bytes, manifest says %s (truncated or grown)"
                                       % (name, digest.size, entry.get("size")))
                continue
            if len(entry["chunk_sha256"]) != len(digest.chunk_sha256):
                result.problems.append("%s: the manifest lists %d chunk digests for %d bytes, not %d (corrupted "
                                       "manifest)" % (name, len(entry["chunk_sha256"]), digest.size,
                                                      len(digest.chunk_sha256)))
                continue
            bad = digest.first_mismatch(entry["chunk_sha256"])
            if bad is not None:
                start = bad * chunk_bytes
                result.problems.append("%s sha256 mismatch in bytes %d-%d (corrupted)"
                                       % (name, start, max(start, min(digest.size, start + chunk_bytes) - 1)))

    # -- removal ---------------------------------------------------------------------------
    def prune(self, job, step, keep=None):
        """Remove all but the newest ``keep`` (default keep_last) published checkpoints. Returns removed paths."""
        keep = self.keep_last if keep is None else keep
        removed = []
        for ckpt in self.checkpoints(job, step)[keep:]:
            shutil.rmtree(ckpt.path, ignore_errors=True)
            removed.append(ckpt.path)
        return removed

    def remove_step(self, job, step):
        """Remove every checkpoint of (``job``, ``step``), and the job directory once empty."""
        shutil.rmtree(self.step_dir(job, step), ignore_errors=True)
        try:
            os.rmdir(self.job_dir(job))
        except OSError:
            pass

    def gc(self, live_jobs=None, stale_tmp_s=3600):
        """Garbage-collect the store; returns the removed paths.

        Removes ``.tmp-*`` directories whose writer (pid in the name) is gone
        or that are older than ``stale_tmp_s``; prunes every step to
        ``keep_last``; with ``live_jobs`` (a set of job ids slurmctld still
        knows) also removes the directories of every other job.
        """
        removed = []
        now = time.time()
        for job in self.jobs():
            if live_jobs is not None and job not in live_jobs:
                shutil.rmtree(self.job_dir(job), ignore_errors=True)
                removed.append(self.job_dir(job))
                continue
            for step in self.steps(job):
                step_dir = self.step_dir(job, step)
                for name in os.listdir(step_dir):
                    match = _TMP.match(name)
                    if not match:
                        continue
                    path = os.path.join(step_dir, name)
                    try:
                        age = now - os.lstat(path).st_mtime
                    except OSError:
                        continue
                    if not _pid_alive(int(match.group(2))) or age > stale_tmp_s:
                        shutil.rmtree(path, ignore_errors=True)
                        removed.append(path)
                removed += self.prune(job, step)
        return removed


def store_from_policy(policy):
    """The CheckpointStore of a settings.compiled.SitePolicy.

    Reads ``policy.checkpoint_store`` (path, keep_last, compression,
    min_free_mb); sites without that setting get /var/lib/slurmbox/checkpoints,
    keep 2, compression "none", no free-space floor.
    """
    settings = getattr(policy, "checkpoint_store", None)
    if isinstance(settings, dict):
        get = settings.get
    else:
        def get(key, default=None):
            return getattr(settings, key, default)
    return CheckpointStore(get("path") or DEFAULT_STORE, get("keep_last", 2) or 2, get("compression", "none") or "none",
                           get("min_free_mb", 0) or 0)


#: Default store location when the site configuration names none.
DEFAULT_STORE = "/var/lib/slurmbox/checkpoints"
