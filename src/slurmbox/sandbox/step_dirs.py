"""Names of a sandboxed step's runtime directory on a node.

The SPANK shim (spank_plugin/slurmbox_spank.c, ``start_supervisor``) creates,
as root and exclusively, ``<runtime_dir>/<node>/<job>.<step>.<incarnation>``,
where the incarnation is ``r<restart count>-<12 hex digits of getrandom>``: a
requeued or migrated-back step reuses its job and step ids, and no one can
predict (or, the node directory being root's 0711, create) the next name. It
then points the root-owned symlink ``<job>.<step>`` at it, so the job's user
and slurmbox's tools reach the newest incarnation by the Slurm step id.
"""

import os
import re
from dataclasses import dataclass

_INCARNATION = r"r\d+-[0-9a-f]{12}"
_STEP_DIR = re.compile(r"^(\d+)\.([A-Za-z0-9_]+)\.(%s)$" % _INCARNATION)
_ALIAS = re.compile(r"^(\d+)\.([A-Za-z0-9_]+)$")


@dataclass(frozen=True)
class StepDirName:
    """A parsed step directory name: ``job`` and ``step`` as Slurm names them (str, e.g. "12",
    "batch"), ``incarnation`` ("r0-0123456789ab", or "" for the alias)."""

    job: str
    step: str
    incarnation: str

    @property
    def step_id(self):
        """``<job>.<step>``, Slurm's step id and the alias's name."""
        return "%s.%s" % (self.job, self.step)


def parse(name):
    """StepDirName of a directory or alias name, or None when ``name`` is neither."""
    match = _STEP_DIR.match(name) or _ALIAS.match(name)
    if not match:
        return None
    return StepDirName(match.group(1), match.group(2), match.group(3) if match.re is _STEP_DIR else "")


def is_incarnation_dir(name):
    """True for ``<job>.<step>.<incarnation>`` (a real step directory, not its alias)."""
    return _STEP_DIR.match(name) is not None


def remove_alias(step_dir):
    """Remove the ``<job>.<step>`` symlink next to ``step_dir`` when it still points at it
    (a newer incarnation's alias is left alone)."""
    parsed = parse(os.path.basename(os.path.normpath(step_dir)))
    if parsed is None or not parsed.incarnation:
        return
    alias = os.path.join(os.path.dirname(os.path.normpath(step_dir)), parsed.step_id)
    try:
        if os.readlink(alias) == os.path.basename(os.path.normpath(step_dir)):
            os.unlink(alias)
    except OSError:
        pass
