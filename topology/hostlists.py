"""Slurm hostlist expressions (``tux[0-3,12],s1``) through python-hostlist.

python-hostlist (NSC, PyPI ``python-hostlist``) implements the same bracket syntax as
Slurm's hostlist parser (slurm.conf(5), "NodeName"), including several bracket groups
(``r[0-1]n[0-31]``), so compression and expansion here need no ``scontrol`` process.
"""

import hostlist as _hostlist

from .model import TopologyError


def expand(expression):
    """``"n[1-3],x"`` -> ``["n1", "n2", "n3", "x"]`` (order kept, duplicates dropped).

    Raises TopologyError on a malformed expression.
    """
    if not expression or expression == "(null)":
        return []
    try:
        return _hostlist.expand_hostlist(expression)
    except _hostlist.BadHostlist as err:
        raise TopologyError("bad hostlist %r: %s" % (expression, err))


def compress(names):
    """Host names (iterable of str) -> one hostlist expression, sorted and deterministic."""
    names = sorted(set(names))
    if not names:
        return ""
    try:
        return _hostlist.collect_hostlist(names)
    except _hostlist.BadHostlist as err:
        raise TopologyError("cannot compress host names: %s" % err)
