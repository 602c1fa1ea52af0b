"""SHA-256 digests of checkpoint image files, one per fixed-size chunk, hashed on every CPU at once.

A whole-file SHA-256 is a sequential computation: one core, ~2 GB/s with the
SHA extensions of this project's VMs, which for a 1 GB image took longer
than ``runsc checkpoint`` writing it (benchmarks/checkpoint_throughput.py).
Hashing fixed-size chunks instead lets every CPU hash its own chunk while
another reads the next, when a checkpoint is published and again when it is
verified before a restore; a mismatch also says which byte range is bad.

A file of ``size`` bytes has ``max(1, ceil(size / chunk_bytes))`` chunks;
chunk ``i`` covers bytes ``[i * chunk_bytes, min(size, (i + 1) * chunk_bytes))``
and its digest is the lowercase hex SHA-256 (FIPS 180-4) of those bytes. A file
no longer than one chunk thus has one digest, equal to its plain sha256 (an
empty file: the sha256 of no bytes).

Reads use ``pread(2)`` of 8 MiB into page-aligned buffers, optionally with
O_DIRECT (open(2)): files ``runsc checkpoint -direct`` wrote are not in the
page cache, and O_DIRECT reads of them right after the write were ~20%
faster here than page-cache reads (benchmarks/checkpoint_throughput.py).
Python's ``os.preadv`` and ``hashlib`` both release the GIL on large
buffers, so threads hash in parallel; at most MAX_WORKERS of them.

Standard library only (the supervisor imports it).
"""

import hashlib
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

#: Bytes per digested chunk (32 MiB: 32 digests per GB of image, ~2 KB of manifest).
CHUNK_BYTES = 32 << 20
#: Bytes per pread(2); a multiple of any logical block size O_DIRECT needs, and a divisor of CHUNK_BYTES.
READ_BYTES = 8 << 20
#: Most threads one digest_files call uses (each holds a READ_BYTES buffer): enough to keep
#: a disk busy while others hash, without taking every CPU of a large shared node.
MAX_WORKERS = 8


@dataclass(frozen=True)
class FileDigest:
    """Chunked digest of one file: ``size`` (bytes read), ``chunk_bytes`` and ``chunk_sha256`` (tuple of hex str)."""

    size: int
    chunk_bytes: int
    chunk_sha256: tuple

    def first_mismatch(self, recorded):
        """Index of the first chunk whose digest differs from ``recorded`` (list of hex str), or None.

        A list of another length (a file that grew or shrank) differs at the
        first index missing from the shorter one.
        """
        for index, (mine, theirs) in enumerate(zip(self.chunk_sha256, recorded)):
            if mine != theirs:
                return index
        if len(self.chunk_sha256) != len(recorded):
            return min(len(self.chunk_sha256), len(recorded))
        return None


def chunk_count(size, chunk_bytes=CHUNK_BYTES):
    """Number of chunks (int >= 1) of a file of ``size`` bytes."""
    return max(1, -(-size // chunk_bytes))


def _open(path, direct):
    """A read-only fd of ``path``: with O_DIRECT where asked and the file system takes it (some refuse
    it with EINVAL: tmpfs before Linux 6.6, some FUSE file systems)."""
    if direct:
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
        except OSError:
            pass
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


class _Buffers(threading.local):
    """One page-aligned read buffer per worker thread of one _run_jobs call (anonymous mmap:
    page-aligned, as O_DIRECT requires); each is also listed in ``made``, for _run_jobs to unmap."""

    def __init__(self, made):
        self.made = made

    def view(self):
        view = getattr(self, "mine", None)
        if view is None:
            buf = mmap.mmap(-1, READ_BYTES)
            view = self.mine = memoryview(buf)
            self.made.append((buf, view))
        return view


def _hash_chunk(buffers, fd, offset, length, digest=None):
    """(bytes read, hex sha256) of ``length`` bytes of ``fd`` from ``offset``, added to ``digest`` (a
    hashlib sha256 holding the chunk's earlier bytes; default a new one); stops early at end of file."""
    view = buffers.view()
    digest, done = digest or hashlib.sha256(), 0
    while done < length:
        want = min(READ_BYTES, length - done)
        # O_DIRECT needs whole blocks: read a full buffer, keep what belongs to this chunk. A short
        # read is not the end of the file (NFS, FUSE may return less): read on until one returns 0.
        count = os.preadv(fd, [view], offset + done)
        if count <= 0:
            break
        count = min(count, want)
        digest.update(view[:count])
        done += count
    return done, digest.hexdigest()


def _default_workers():
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, MAX_WORKERS))


def _run_jobs(jobs, workers):
    """Run ``jobs`` (list per file of (fd, offset, length, digest or None)) on ``workers`` threads.

    Returns, per file, the list of (bytes read, hex digest) in job order.
    """
    made = []
    buffers = _Buffers(made)
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="image-digest") as pool:
            futures = [[pool.submit(_hash_chunk, buffers, *job) for job in file_jobs] for file_jobs in jobs]
            try:
                return [[future.result() for future in file_futures] for file_futures in futures]
            except BaseException:
                pool.shutdown(cancel_futures=True)  # a failed read stops the rest of the image
                raise
    finally:
        for buf, view in made:  # the pool's threads have exited
            view.release()
            buf.close()


def digest_files(paths, chunk_bytes=CHUNK_BYTES, direct=False, workers=None):
    """Chunked digests of ``paths`` (list of str), in that order: a list of FileDigest.

    ``direct``: read with O_DIRECT where the file system allows it;
    ``workers``: threads reading and hashing at once (default: the CPUs
    this process may run on, at most MAX_WORKERS). ``chunk_bytes`` must be a multiple of
    READ_BYTES. A file that changes size while it is read gets the size
    actually read. Raises OSError when a file cannot be opened or read,
    ValueError for a ``chunk_bytes`` that is not a multiple of READ_BYTES.
    """
    if chunk_bytes % READ_BYTES:
        raise ValueError("chunk_bytes must be a multiple of %d" % READ_BYTES)
    fds = []
    try:
        jobs = []
        for path in paths:
            fd = _open(path, direct)
            fds.append(fd)
            size = os.fstat(fd).st_size
            jobs.append([(fd, index * chunk_bytes, min(chunk_bytes, size - index * chunk_bytes), None)
                         for index in range(chunk_count(size, chunk_bytes))])
        return [FileDigest(sum(count for count, _ in parts), chunk_bytes, tuple(digest for _, digest in parts))
                for parts in _run_jobs(jobs, workers or _default_workers())]
    finally:
        for fd in fds:
            os.close(fd)


class _Followed:
    """A file being hashed as it grows: its fd, how far it is read, the current chunk's hash and the finished ones."""

    def __init__(self, fd, inode):
        self.fd, self.inode = fd, inode
        self.offset, self.in_chunk, self.chunk, self.done = 0, 0, hashlib.sha256(), []


class ImageFollower:
    """Hashes the files a writer is appending to in ``directory`` while it writes them.

    For writers that only append, each file once, front to back, with
    write(2) (seen with strace for the runsc releases listed in
    slurmbox.migrate.runsc_checkpoint.SEQUENTIAL_IMAGE_WRITERS), every byte
    below a file's current size is final, so it can be hashed at once and
    only the tail is left when the writer exits. The digests are the same
    as digest_files gives. ``start`` before the writer starts; ``finish``
    after it exited returns ``{name: FileDigest}``; ``stop`` abandons the
    work. A file found replaced or shrunk is left out of the result (hash
    it afterwards with digest_files). Not thread-safe beyond its own thread.

    Reads go through the page cache, where such a writer's data is: files
    written with O_DIRECT are read back with digest_files instead (followed
    while written, they slowed runsc's checkpoint 2x here). ``poll_s``: how
    long the follower thread waits, seconds, when every file is read up to
    its current size.
    Raises ValueError for a ``chunk_bytes`` that is not a multiple of READ_BYTES.
    """

    def __init__(self, directory, chunk_bytes=CHUNK_BYTES, poll_s=0.005):
        if chunk_bytes % READ_BYTES:
            raise ValueError("chunk_bytes must be a multiple of %d" % READ_BYTES)
        self.directory, self.chunk_bytes, self.poll_s = directory, chunk_bytes, poll_s
        self.files, self.error = {}, None
        self._stop = threading.Event()
        self._buf = mmap.mmap(-1, READ_BYTES)
        self._view = memoryview(self._buf)
        self._thread = threading.Thread(target=self._run, name="image-follower", daemon=True)

    def start(self):
        """Start following in a thread."""
        self._thread.start()

    def _run(self):
        try:
            while not self._stop.is_set():
                if not self._pass():
                    self._stop.wait(self.poll_s)
        except Exception as err:  # finish() then hashes nothing itself: publish reads every file back
            self.error = err

    def _pass(self):
        """Read what every file has gained since the last pass; returns whether anything was read."""
        progressed = False
        for name in sorted(os.listdir(self.directory)):
            state = self.files.get(name)
            if state is None:
                path = os.path.join(self.directory, name)
                if name.startswith(".") or os.path.islink(path) or not os.path.isfile(path):
                    continue
                try:
                    fd = _open(path, direct=False)
                except FileNotFoundError:
                    continue
                try:
                    state = self.files[name] = _Followed(fd, os.fstat(fd).st_ino)
                except OSError:
                    os.close(fd)
                    raise
            progressed |= self._read(state)
        return progressed

    def _read(self, state):
        size = os.fstat(state.fd).st_size
        progressed = False
        while state.offset < size:
            want = min(READ_BYTES, size - state.offset)
            count = os.preadv(state.fd, [self._view[:want]], state.offset)
            if count <= 0:
                break
            count = min(count, want)
            self._feed(state, self._view[:count])
            state.offset += count
            progressed = True
        return progressed

    def _feed(self, state, data):
        """Add ``data`` (the bytes at state.offset) to the chunk hashes, closing chunks at their boundaries."""
        while len(data):
            piece = data[:self.chunk_bytes - state.in_chunk]
            state.chunk.update(piece)
            state.in_chunk += len(piece)
            data = data[len(piece):]
            if state.in_chunk == self.chunk_bytes:
                state.done.append(state.chunk.hexdigest())
                state.chunk, state.in_chunk = hashlib.sha256(), 0

    def finish(self, workers=None):
        """After the writer exited: hash what is left and return ``{name: FileDigest}``.

        What the follower had not read yet is hashed chunk by chunk on
        ``workers`` threads (default: the CPUs this process may run on), as
        digest_files does. Files replaced, shrunk or grown since they were
        first seen are left out. Raises OSError when a file cannot be read.
        """
        self._halt()
        try:
            if self.error is not None:
                return {}
            self._pass()  # pick up files created after the last pass
            names, jobs, sizes = [], [], []
            for name, state in sorted(self.files.items()):
                size = os.fstat(state.fd).st_size
                offset, file_jobs = state.offset, []
                if state.in_chunk:  # the chunk being read goes on from where the follower stopped
                    length = min(self.chunk_bytes - state.in_chunk, size - offset)
                    file_jobs.append((state.fd, offset, length, state.chunk))
                    offset += length
                if offset < size or not (state.done or state.in_chunk):
                    file_jobs += [(state.fd, start, min(self.chunk_bytes, size - start), None)
                                  for start in range(offset, max(size, offset + 1), self.chunk_bytes)]
                names.append(name)
                jobs.append(file_jobs)
                sizes.append(size)
            result = {}
            for name, size, parts in zip(names, sizes, _run_jobs(jobs, workers or _default_workers())):
                state = self.files[name]
                read = state.offset + sum(count for count, _ in parts)
                try:
                    same = os.lstat(os.path.join(self.directory, name)).st_ino == state.inode
                except OSError:
                    same = False
                if same and read == size:
                    result[name] = FileDigest(size, self.chunk_bytes,
                                              tuple(state.done + [digest for _, digest in parts]))
            return result
        finally:
            self._close()

    def stop(self):
        """Abandon the work (the writer failed); closes everything."""
        self._halt()
        self._close()

    def _halt(self):
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()

    def _close(self):
        for state in self.files.values():
            os.close(state.fd)
        self.files = {}
        self._view.release()
        self._buf.close()
