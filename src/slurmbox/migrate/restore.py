"""Choose the checkpoint a requeued step restores from, and rebuild its OCI spec.

The newest published checkpoint that verifies (manifest present, every file
with the recorded size and sha256, written for the same user) is chosen; each
newer one that does not is reported with the reason, so the job's output and
the slurmbox log can say which checkpoint was skipped and why. Standard
library only (step start path).
"""

import json
import os
from dataclasses import dataclass, field

from slurmbox.migrate.store import SPEC, CheckpointError


@dataclass
class Selection:
    """``checkpoint``: the Checkpoint to restore, or None; ``skipped``: list of
    (Checkpoint, [problems]) for newer checkpoints that failed verification;
    ``foreign``: Checkpoints of the same srun step id taken of another command
    line (not candidates: the step starts fresh whatever restore_fallback says)."""

    checkpoint: object = None
    skipped: list = field(default_factory=list)
    foreign: list = field(default_factory=list)

    def messages(self):
        """Lines (str) for the job's stderr and the slurmbox log describing the choice."""
        lines = []
        if self.foreign:
            ckpt = self.foreign[0]
            lines.append("checkpoint(s) %s of job %s step %s were taken of a different command line or step shape "
                         "(srun argv, nodes, tasks); not restoring them: this step starts from the beginning"
                         % (", ".join(c.name for c in self.foreign), ckpt.job, ckpt.step))
        for ckpt, problems in self.skipped:
            lines.append("checkpoint %s of job %s step %s is unusable: %s"
                         % (ckpt.name, ckpt.job, ckpt.step, "; ".join(problems)))
        if self.checkpoint is not None:
            m = self.checkpoint.manifest
            lines.append("restoring job %s step %s from checkpoint %s (taken on %s at %s, %s)%s"
                         % (self.checkpoint.job, self.checkpoint.step, self.checkpoint.name, m.get("node"),
                            m.get("time"), m.get("reason", "checkpoint"),
                            ", falling back past the newer one(s) above" if self.skipped else ""))
        return lines


def accelerator_problem(manifest, accelerators):
    """Why a checkpoint with ``manifest`` cannot be restored with this run's ``accelerators``, or None.

    ``accelerators``: slurmbox.sandbox.devices.accelerators() of this run's
    allocation (None: none). A checkpoint that recorded accelerators holds
    their CUDA state (runsc checkpoint --cuda-checkpoint-path); gVisor
    toggles it back with cuda-checkpoint and no device map, onto as many
    devices of the same vendor and model (NVIDIA cuda-checkpoint), so a run
    with another number, or other gres types where both runs have typed
    ones, is refused here instead of failing inside runsc.
    """
    recorded = (manifest or {}).get("accelerators")
    if not recorded:
        return None
    have = accelerators or {"vendor": None, "count": 0}
    if (recorded.get("vendor"), recorded.get("count")) != (have.get("vendor"), have.get("count")):
        return ("taken with %s %s device(s), and this run has %s %s: its GPU state restores only onto as many "
                "devices of the same kind (request the same GPUs, e.g. --gres=gpu:%s)"
                % (recorded.get("count"), recorded.get("vendor"), have.get("count"), have.get("vendor") or "accelerator",
                   recorded.get("count")))
    models, now = recorded.get("models") or [], have.get("models") or []
    if models and now and models != now:  # both typed by Slurm (gres Type=) and different
        return ("taken on %s GPUs, and this run has %s: CUDA state restores only onto the same model (request it, "
                "e.g. --gres=gpu:%s:%s)" % (",".join(models), ",".join(now), models[0], recorded.get("count")))
    return None


def select_checkpoint(store, job, step, uid, script_sha256=None, command_sha256=None, runsc_features=None,
                      accelerators=None):
    """The Selection for (``job``, ``step``) of user ``uid`` in ``store`` (a CheckpointStore).

    Verifies newest first and stops at the first valid one. Interrupted
    checkpoints (temporary directories) are never considered. With
    ``script_sha256`` (of this run's batch script), a checkpoint recorded for
    another script (a job id reused after a controller reset) is skipped.
    With ``command_sha256`` (an srun step's command digest,
    slurmbox.migrate.step_checkpoint), checkpoints recorded for another
    command line are ``foreign``. With ``runsc_features`` (runsc_checkpoint.checkpoint_features
    of this node's runsc), a checkpoint written by another runsc release is skipped
    (gVisor restores only its own release's images), before its files are read;
    so is one whose GPU state does not fit this run's ``accelerators``
    (accelerator_problem).
    """
    from slurmbox.migrate.runsc_checkpoint import restore_flags, restore_problem

    selection = Selection()
    for ckpt in store.checkpoints(job, step):
        if command_sha256 and (ckpt.manifest or {}).get("command_sha256") not in (None, command_sha256):
            selection.foreign.append(ckpt)
            continue
        release = restore_problem(ckpt.manifest, runsc_features) if runsc_features else None
        release = release or accelerator_problem(ckpt.manifest, accelerators)
        if release:
            selection.skipped.append((ckpt, [release]))
            continue
        # Read the way runsc restore will: O_DIRECT for an image it reads with --direct, else through
        # the page cache, which the verification leaves filled for it.
        verdict = store.verify(ckpt, uid=uid, direct="--direct" in restore_flags(runsc_features, ckpt.manifest))
        recorded = (ckpt.manifest or {}).get("batch_script_sha256")
        if script_sha256 and recorded and recorded != script_sha256:
            verdict.problems.append("taken of a different batch script (job id %s reused?)" % job)
        if verdict.valid:
            selection.checkpoint = ckpt
            break
        selection.skipped.append((ckpt, verdict.problems))
    return selection


def restore_spec(ckpt, new_spec, batch_script=None):
    """The OCI spec (dict) to restore ``ckpt`` with on this node.

    runsc restores the sandbox's own state (processes, memory, mount table), so
    the spec must describe the same mounts as the checkpointed one: it is the
    saved spec, with each bind mount's host ``source`` taken from ``new_spec``
    (this run's spec) for the same destination; the batch script, which lives
    in this node's slurmd spool directory, is bound at the destination it had.
    Devices are never taken from the saved spec: the sandbox gets this run's
    allocation (``linux.devices``, the device cgroup rules in
    ``linux.resources.devices`` and the ``org.slurmbox.devices`` annotation of
    ``new_spec``), whatever GPUs the checkpointed run held; CUDA state saved
    with ``cuda-checkpoint`` is brought back onto them by runsc's restore.
    ``batch_script``: this run's script path. Raises CheckpointError when the
    saved spec is missing or a saved mount has no counterpart here.
    """
    try:
        with open(os.path.join(ckpt.path, SPEC)) as handle:
            saved = json.load(handle)
    except (OSError, ValueError) as err:
        raise CheckpointError("checkpoint %s has no readable %s: %s" % (ckpt.name, SPEC, err))
    sources = {m.get("destination"): m.get("source") for m in new_spec.get("mounts", []) if m.get("type") == "bind"}
    old_script = (ckpt.manifest or {}).get("batch_script")
    spec = dict(saved)
    mounts = []
    for mount in saved.get("mounts", []):
        mount = dict(mount)
        if mount.get("type") == "bind":
            destination = mount.get("destination")
            if old_script and destination == old_script and batch_script:
                mount["source"] = batch_script
            elif destination in sources:
                mount["source"] = sources[destination]
            elif not os.path.exists(mount.get("source", "")):
                raise CheckpointError("checkpoint %s binds %s from %s, which does not exist on this node"
                                      % (ckpt.name, destination, mount.get("source")))
        mounts.append(mount)
    spec["mounts"] = mounts
    _devices_of_this_run(spec, new_spec)
    return spec


def _devices_of_this_run(spec, new_spec):
    """Replace ``spec``'s devices (changed in place) with ``new_spec``'s: the allocation of this run."""
    from slurmbox.sandbox.bundle import DEVICES_ANNOTATION

    new_linux = new_spec.get("linux") or {}
    linux = spec["linux"] = dict(spec.get("linux") or {})
    linux["devices"] = list(new_linux.get("devices") or [])
    resources = linux["resources"] = dict(linux.get("resources") or {})
    new_rules = (new_linux.get("resources") or {}).get("devices")
    if new_rules is None:
        resources.pop("devices", None)
    else:
        resources["devices"] = list(new_rules)
    annotations = spec["annotations"] = dict(spec.get("annotations") or {})
    annotations.pop(DEVICES_ANNOTATION, None)
    if DEVICES_ANNOTATION in (new_spec.get("annotations") or {}):
        annotations[DEVICES_ANNOTATION] = new_spec["annotations"][DEVICES_ANNOTATION]
