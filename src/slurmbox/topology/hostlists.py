"""Slurm hostlist expressions (``tux[0-3,12],s1``).

Expansion uses python-hostlist (NSC, PyPI ``python-hostlist``), which implements Slurm's
bracket syntax (slurm.conf(5), "NodeName"), so no ``scontrol`` process is needed.
Compression is done here: python-hostlist's ``collect_hostlist`` takes ~35 ms for 16,384
names (most of ``generate --format tree`` on a large fabric) and may emit several
bracket groups (``r[0-1]n[0-31]``); this one writes one bracket group per name prefix
(``gpu[00001-16384]``), keeps zero padding, and is checked against python-hostlist's
expansion in the tests.
"""

import re
from operator import itemgetter

import hostlist as _hostlist

from .model import TopologyError, natural_key


#: A Slurm node name (slurm.conf(5) NodeName) as topology sources may name hosts: no commas,
#: brackets, "=" or spaces, which would inject other names or keys into topology.conf.
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def is_host_name(name):
    """True when ``name`` (str) is one plain host name, safe to write into a Slurm Nodes= list.

    Fabric sources report host names that the hosts themselves set (an HCA's
    NodeDescription, a NetQ agent's hostname), so they are checked before use.
    """
    return isinstance(name, str) and _HOST_NAME.match(name) is not None


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


_DIGITS = "0123456789"
# "<prefix><ASCII digits>" per line; the prefix is what str.rstrip(_DIGITS) leaves.
_NAME = re.compile(r"([^\n]*?)([0-9]*)\n")


def _one_prefix(names):
    """``{prefix: [digit strings]}`` when every name (a set of str) is one prefix followed by
    ASCII digits, as a leaf switch's hosts usually are (``gpu00001``..``gpu00032``), else
    None. The same split as the general path of :func:`compress`, without a loop per name
    in Python (writing a large fabric's tree compresses 16,384 names)."""
    prefix = next(iter(names)).rstrip(_DIGITS)  # any name's prefix: all must share it
    cut = len(prefix)
    if set(map(itemgetter(slice(cut)), names)) != {prefix}:
        return None
    digits = list(map(itemgetter(slice(cut, None)), names))
    joined = "".join(digits)
    if "" in digits or not (joined.isascii() and joined.isdigit()):
        return None
    return {prefix: digits}


def compress(names):
    """Host names (iterable of str) -> one hostlist expression, sorted and deterministic.

    Names ending in digits are grouped by prefix and zero padding (``n01``..``n10`` ->
    ``n[01-10]``; ``n9``, ``n10`` -> ``n[9-10]``); other names are listed as they are.
    """
    names = set(names)
    if not names:
        return ""
    plain, by_prefix = [], _one_prefix(names)
    if by_prefix is None:
        by_prefix = {}
        joined = "\n".join(names) + "\n"
        split = _NAME.findall(joined)
        if len(split) != len(names):  # a name holding a line break: split one by one
            split = [(n.rstrip(_DIGITS), n[len(n.rstrip(_DIGITS)):]) for n in names]
        for prefix, digits in split:
            if not digits:
                plain.append(prefix)
                continue
            found = by_prefix.get(prefix)
            if found is None:
                by_prefix[prefix] = [digits]
            else:
                found.append(digits)
    parts = [(name, name) for name in plain]
    for prefix, all_digits in by_prefix.items():
        if "[" in prefix or "]" in prefix or "," in prefix:  # not a plain name: list as they are
            parts += [(prefix + d, prefix + d) for d in all_digits]
            continue
        lengths = set(map(len, all_digits))
        if len(lengths) == 1:  # one digit count (the usual case): padded when any starts with "0"
            length = lengths.pop()
            groups = {length if length > 1 and min(all_digits)[0] == "0" else 0: all_digits}
        else:
            widths = {len(d) for d in all_digits if len(d) > 1 and d[0] == "0"}
            groups = {}
            for digits in all_digits:
                groups.setdefault(len(digits) if len(digits) in widths else 0, []).append(digits)
        for width, digits in groups.items():
            numbers = sorted(map(int, digits))
            fmt = "%%0%dd" % width if width else "%d"
            first = prefix + fmt % numbers[0]
            if len(numbers) == 1:
                parts.append((first, first))
                continue
            if numbers[-1] - numbers[0] == len(numbers) - 1:  # one run (numbers are distinct)
                text = (fmt + "-" + fmt) % (numbers[0], numbers[-1])
            else:
                ranges, start, prev = [], numbers[0], numbers[0]
                for number in numbers[1:]:
                    if number != prev + 1:
                        ranges.append((start, prev))
                        start = number
                    prev = number
                ranges.append((start, prev))
                text = ",".join(fmt % a if a == b else (fmt + "-" + fmt) % (a, b) for a, b in ranges)
            parts.append((first, "%s[%s]" % (prefix, text)))
    if len(parts) == 1:
        return parts[0][1]
    return ",".join(expr for _, expr in sorted(parts, key=lambda p: (natural_key(p[0]), p[0])))
