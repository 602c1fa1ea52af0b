"""Save and restore one sandbox with runsc: the commands, and what goes in the manifest.

``runsc checkpoint --image-path=DIR ID`` saves the sandbox's whole state
(gVisor's kernel, processes, memory) into DIR and stops the sandbox (the 2022
build's ``--leave-running`` never returns, so it is not used); ``runsc
restore --image-path=DIR --bundle B ID`` starts a sandbox from it, and without
``--detach`` waits for it and exits with its init's status, like ``runsc
run`` (runsc(8) ``runsc help checkpoint``/``restore``; seen on the 2022 build).

runsc builds differ in their ``checkpoint`` flags (recorded outputs in
tests/data/runsc/):

- 0.0~20221219 (Debian 12) has only ``-image-path``, ``-leave-running`` and
  ``-work-path``, and always compresses the image with flate at best speed
  (gVisor's pkg/state/statefile of that release);
- 0.0~20240729 (Debian 13) adds ``-compression none|flate-best-speed``
  (default flate-best-speed), ``-direct`` (O_DIRECT for the pages file) and
  ``-exclude-committed-zero-pages``.

The flags of the installed runsc are read from its ``checkpoint --help`` once
per binary (cached by path, size and mtime, like
slurmbox.sandbox.runsc.capabilities). The site's
``checkpoint_store.compression`` is passed as ``-compression`` where runsc
has the flag; a build without it writes flate-compressed images whatever the
setting says, and the manifest records the compression actually used.
``-direct`` is passed where runsc has it and the store's file system takes
O_DIRECT writes: measured with benchmarks/checkpoint_throughput.py on the
2024 build, it cut ``runsc checkpoint`` of 1 GB of memory from ~2.4 s to
~0.5 s (the page-cache path is slow in that build). Restores read the image
through the page cache, which verifying its sha256 has just filled.

Standard library only (the supervisor imports it).
"""

import json
import os
import re
import subprocess
import time

from slurmbox.migrate import image_digest
from slurmbox.migrate.store import IMAGE_COMPRESSIONS, CheckpointError
from slurmbox.sandbox.runsc import call as call_runsc

#: Image compression of runsc builds without a ``-compression`` flag: gVisor's statefile
#: writer always used flate at best speed before the flag existed (pkg/state/statefile).
BUILTIN_COMPRESSION = "flate-best-speed"
#: Cache file of checkpoint_features, in the cache directory given (the node's runtime directory).
FEATURES_CACHE = "runsc-checkpoint-flags.json"
#: Go's flag package usage lines: "  -name [type]" then a tab-indented description (pkg flag PrintDefaults).
_FLAG_LINE = re.compile(r"^  -{1,2}([A-Za-z0-9][A-Za-z0-9_.-]*)(?:[ \t]+(\S+))?[ \t]*$")
_VALUES = re.compile(r"Values:\s*([A-Za-z0-9_.-]+(?:\|[A-Za-z0-9_.-]+)+)")
_DEFAULT = re.compile(r"\(default ([^)]*)\)")
_memo = {}
#: runsc releases (``runsc --version``) seen with strace to write every checkpoint image file
#: front to back with write(2), once, and whose followed digests tests/test_runsc_checkpoint_flags.py
#: checks against a read-back: their images are hashed while runsc writes them
#: (image_digest.ImageFollower) unless runsc writes with ``-direct``; other images are read
#: back after runsc exits. Measured with benchmarks/checkpoint_throughput.py: the 2022 build
#: (flate, through the page cache) is hashed by the time runsc exits. The 2024 build with
#: ``-direct`` writes its pages file in a few writes of hundreds of MB at the end (reading it
#: while it is written slowed the checkpoint 2x); its page-cache path was not traced, so it
#: is not listed.
SEQUENTIAL_IMAGE_WRITERS = ("0.0~20221219.0",)


class CheckpointFailed(CheckpointError):
    """``runsc checkpoint`` failed; the sandbox is stopped and its state since the previous checkpoint lost."""


def parse_checkpoint_help(text):
    """Flags of a ``runsc checkpoint --help`` output (str; Go flag package format).

    Returns ``{name: {"type": "bool"|TYPE, "values": [str] or None,
    "default": str or None}}``; ``values`` is the "Values: a|b" list of a
    choice flag (e.g. ``compression``). An unrecognised text gives ``{}``.
    """
    flags, current = {}, None
    for line in (text or "").splitlines():
        match = _FLAG_LINE.match(line)
        if match:
            current = flags[match.group(1)] = {"type": match.group(2) or "bool", "values": None, "default": None,
                                               "usage": ""}
            continue
        if current is not None and line.startswith("    "):
            current["usage"] = (current["usage"] + " " + line.strip()).strip()
    for entry in flags.values():
        values = _VALUES.search(entry["usage"])
        default = _DEFAULT.search(entry["usage"])
        entry["values"] = values.group(1).rstrip(".").split("|") if values else None
        entry["default"] = default.group(1) if default else None
        del entry["usage"]
    return flags


def checkpoint_features(runsc, cache_dir=None):
    """What ``runsc checkpoint`` of the binary at ``runsc`` (path) supports.

    Returns ``{"key": str, "version": str, "flags": parse_checkpoint_help(...),
    "restore_flags": the same for ``runsc restore --help``}``.
    Cached in ``cache_dir``/runsc-checkpoint-flags.json when ``cache_dir`` is
    given (else in this process), keyed by the binary's path, size and mtime.
    Raises CheckpointError when the binary cannot be run.
    """
    try:
        info = os.stat(runsc)
    except OSError as err:
        raise CheckpointError("cannot read the runsc binary %s: %s" % (runsc, err))
    key = "%s:%d:%d" % (runsc, info.st_size, info.st_mtime_ns)
    cache = os.path.join(cache_dir, FEATURES_CACHE) if cache_dir else None
    if key in _memo:
        return _memo[key]
    if cache:
        try:
            with open(cache) as handle:
                data = json.load(handle)
            if data.get("key") == key and "restore_flags" in data:
                _memo[key] = data
                return data
        except (OSError, ValueError):
            pass
    try:
        listing = call_runsc([runsc, "checkpoint", "--help"], timeout=60)
        restore_listing = call_runsc([runsc, "restore", "--help"], timeout=60)
        version = call_runsc([runsc, "--version"], timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CheckpointError("cannot run %s to read its checkpoint flags: %s" % (runsc, err))
    first = version.splitlines()[0] if version.strip() else "unknown"
    data = {"key": key, "version": first.replace("runsc version ", "").strip(),
            "flags": parse_checkpoint_help(listing.stdout + listing.stderr),
            "restore_flags": parse_checkpoint_help(restore_listing.stdout + restore_listing.stderr)}
    _memo[key] = data
    if cache:
        try:
            os.makedirs(cache_dir, exist_ok=True)
            tmp = "%s.%d" % (cache, os.getpid())
            with open(tmp, "w") as handle:
                json.dump(data, handle)
            os.replace(tmp, cache)
        except OSError:
            pass  # the cache only saves a runsc call
    return data


def checkpoint_flags(features, compression="none", direct=False, extra_flags=()):
    """The ``runsc checkpoint`` flags for the site's image ``compression`` and runsc ``features``.

    ``features``: checkpoint_features() of the runsc used; ``compression``:
    the site's checkpoint_store.compression ("none" or "flate-best-speed");
    ``direct``: ask for O_DIRECT writes of the pages file where runsc has
    ``-direct`` (ignored otherwise); ``extra_flags``: appended as given (e.g.
    the CUDA checkpoint flag). Returns (list of flags, the image compression
    runsc will use). Raises CheckpointError for a compression slurmbox does not
    know or this runsc's ``-compression`` does not list.
    """
    if compression not in IMAGE_COMPRESSIONS:
        raise CheckpointError("checkpoint_store.compression=%r is not supported; use one of: %s"
                              % (compression, ", ".join(IMAGE_COMPRESSIONS)))
    known = features.get("flags") or {}
    flags = []
    option = known.get("compression")
    if option is None:
        effective = BUILTIN_COMPRESSION  # the build always compresses; nothing to choose
    else:
        if option.get("values") and compression not in option["values"]:
            raise CheckpointError("runsc %s cannot write checkpoint images with compression %r (its -compression "
                                  "takes %s); change checkpoint_store.compression in the site configuration"
                                  % (features.get("version", "?"), compression, "|".join(option["values"])))
        flags.append("--compression=%s" % compression)
        effective = compression
    if direct and "direct" in known:
        flags.append("--direct")
    return flags + list(extra_flags), effective


def checkpoint_argv(prefix, image_dir, container_id, flags=()):
    """The ``runsc checkpoint`` command line (list): ``prefix`` (binary and global flags), ``flags``, image, id."""
    return prefix + ["checkpoint", *flags, "--image-path", image_dir, container_id]


def checkpoint_sandbox(prefix, container_id, pending, manifest_fields, spec, extra_flags=(), cache_dir=None,
                       direct=None):
    """Checkpoint container ``container_id`` into ``pending`` (a store.PendingCheckpoint) and publish it.

    ``prefix``: the runsc command prefix (binary and global flags);
    ``manifest_fields``: dict recorded in the manifest (node, reason, ...);
    ``spec``: the sandbox's OCI spec (dict); ``extra_flags``: flags for
    ``runsc checkpoint`` (e.g. its CUDA checkpoint flag for GPU sandboxes);
    ``cache_dir``: where checkpoint_features caches runsc's flags; ``direct``:
    see checkpoint_flags; None (default) = where runsc has ``-direct`` and
    the store's file system takes O_DIRECT (PendingCheckpoint.direct_io_ok).
    The image compression is the store's
    (``pending.store.compression``). The manifest's ``runsc`` entry gets
    ``version``, ``checkpoint_flags``, ``image_compression`` and
    ``image_digest``: "while-written" when the image files were hashed as
    runsc wrote them (runsc releases in SEQUENTIAL_IMAGE_WRITERS, without
    ``-direct``; image_digest.ImageFollower), else "read-back". Returns
    (Checkpoint, seconds the runsc checkpoint took). Raises CheckpointFailed
    when runsc fails (the partial image is removed), CheckpointError when the
    compression setting cannot be honoured (nothing was stopped) and store
    errors from publishing.
    """
    try:
        features = checkpoint_features(prefix[0], cache_dir)
        if direct is None:
            direct = "direct" in features["flags"] and pending.direct_io_ok()
        flags, compression = checkpoint_flags(features, getattr(pending.store, "compression", "none"), direct,
                                              extra_flags)
    except CheckpointError:
        pending.abort()
        raise
    follower = None
    if features.get("version") in SEQUENTIAL_IMAGE_WRITERS and "--direct" not in flags:
        follower = image_digest.ImageFollower(pending.image_dir)
        follower.start()
    started = time.monotonic()
    try:
        result = call_runsc(checkpoint_argv(prefix, pending.image_dir, container_id, flags))
    except BaseException:
        if follower is not None:
            follower.stop()
        raise
    took = time.monotonic() - started
    digests = {}
    if follower is not None:
        if result.returncode != 0:
            follower.stop()
        else:
            try:
                digests = follower.finish()
            except OSError:
                digests = {}  # publish reads the files back instead
    if result.returncode != 0:
        pending.abort()
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise CheckpointFailed("runsc checkpoint failed (exit %d): %s" % (result.returncode,
                                                                          detail[-1] if detail else "no message"))
    fields = dict(manifest_fields)
    fields["runsc"] = dict(fields.get("runsc") or runsc_description(prefix), version=features.get("version"),
                           checkpoint_flags=flags, image_compression=compression,
                           image_digest="while-written" if digests else "read-back")
    fields.setdefault("runsc_checkpoint_s", round(took, 3))
    return pending.publish(fields, spec, direct_read="--direct" in flags, digests=digests), took


def restore_argv(prefix, image_dir, bundle_dir, container_id, flags=()):
    """The ``runsc restore`` command line (list) for a checkpoint image directory, with ``flags`` (restore_flags)."""
    return prefix + ["restore", *flags, "--image-path", image_dir, "--bundle", bundle_dir, container_id]


def restore_flags(features, manifest):
    """``runsc restore`` flags (list) for a checkpoint with ``manifest`` (dict) on the runsc of ``features``.

    - ``--direct`` (O_DIRECT reads of the pages file) where this runsc's
      restore has it and the image was written with ``--direct``: measured
      with benchmarks/checkpoint_throughput.py on the 2024 build, restoring
      1 GB of memory took ~0.7 s that way and ~2.3 s through the page cache.
      slurmbox.migrate.restore verifies such images with O_DIRECT reads too.
    - ``--background`` where this runsc's restore has it (gVisor releases of
      2025 on; not the Debian builds) and the image is uncompressed, which it
      requires: the program runs again as soon as the kernel state is loaded,
      and memory pages load while it runs (gVisor g3doc
      user_guide/checkpoint_restore.md "Background Restore"). The image has
      been verified before runsc reads it, so nothing unverified is loaded
      either way; runsc keeps the pages file open until it is loaded, so a
      pruned or collected image frees its space only then (on NFS its
      directory stays, holding ``.nfs*`` files, until a later ``gc``).

    ``features`` None (unknown runsc) gives no flags.
    """
    runsc = (manifest or {}).get("runsc") or {}
    written = runsc.get("checkpoint_flags") or []
    available = (features or {}).get("restore_flags") or {}
    flags = []
    if "direct" in available and "--direct" in written:
        flags.append("--direct")
    if "background" in available and runsc.get("image_compression") == "none":
        flags.append("--background")
    return flags


def runsc_description(prefix):
    """Manifest ``runsc`` entry: binary path and global flags from the command ``prefix``.

    checkpoint_sandbox adds ``version``, ``checkpoint_flags`` (list) and
    ``image_compression`` ("none" or "flate-best-speed").
    """
    return {"binary": prefix[0], "flags": list(prefix[1:])}


def restore_problem(manifest, features):
    """Why the runsc of ``features`` (checkpoint_features) cannot restore a checkpoint, or None.

    ``manifest``: the checkpoint's manifest (dict; its ``runsc.version`` is
    recorded by checkpoint_sandbox). gVisor restores only images written by
    the same release: seen on this project's machines, runsc 0.0~20221219 and
    0.0~20240729 each failed (exit 128, a Go panic in pkg/urpc) to restore
    the other's image. Manifests without a recorded version, and runsc
    binaries whose version is unknown, are not judged (None).
    """
    recorded = ((manifest or {}).get("runsc") or {}).get("version")
    local = (features or {}).get("version")
    if not recorded or not local or "unknown" in (recorded, local) or recorded == local:
        return None
    return ("written by runsc %s; this node's runsc %s cannot restore it (gVisor restores only images of its own "
            "release): keep one runsc version on the nodes a job can be requeued to" % (recorded, local))
