"""Save and restore one sandbox with runsc: the commands, and what goes in the manifest.

``runsc checkpoint --image-path=DIR ID`` saves the sandbox's whole state
(gVisor's kernel, processes, memory) into DIR and stops the sandbox (the 2022
build's ``--leave-running`` never returns, so it is not used); ``runsc
restore --image-path=DIR --bundle B ID`` starts a sandbox from it, and without
``--detach`` waits for it and exits with its init's status, like ``runsc
run`` (runsc(8) ``runsc help checkpoint``/``restore``; seen on the 2022 build).
"""

import subprocess
import time

from slurmbox.migrate.store import CheckpointError


class CheckpointFailed(CheckpointError):
    """``runsc checkpoint`` failed; the sandbox is stopped and its state since the previous checkpoint lost."""


def checkpoint_sandbox(prefix, container_id, pending, manifest_fields, spec, extra_flags=()):
    """Checkpoint container ``container_id`` into ``pending`` (a store.PendingCheckpoint) and publish it.

    ``prefix``: the runsc command prefix (binary and global flags);
    ``manifest_fields``: dict recorded in the manifest (node, reason, ...);
    ``spec``: the sandbox's OCI spec (dict); ``extra_flags``: flags for
    ``runsc checkpoint`` (e.g. its CUDA checkpoint flag for GPU sandboxes). Returns (Checkpoint, seconds the
    runsc checkpoint took). Raises CheckpointFailed when runsc fails (the
    partial image is removed) and store errors from publishing.
    """
    started = time.monotonic()
    result = subprocess.run(prefix + ["checkpoint", *extra_flags, "--image-path", pending.image_dir, container_id],
                            capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if result.returncode != 0:
        pending.abort()
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise CheckpointFailed("runsc checkpoint failed (exit %d): %s" % (result.returncode,
                                                                          detail[-1] if detail else "no message"))
    fields = dict(manifest_fields)
    fields.setdefault("runsc_checkpoint_s", round(took, 3))
    return pending.publish(fields, spec), took


def restore_argv(prefix, image_dir, bundle_dir, container_id):
    """The ``runsc restore`` command line (list) for a checkpoint image directory."""
    return prefix + ["restore", "--image-path", image_dir, "--bundle", bundle_dir, container_id]


def runsc_description(prefix):
    """Manifest ``runsc`` entry: binary path and global flags from the command ``prefix``."""
    return {"binary": prefix[0], "flags": list(prefix[1:])}
