"""Slurm hostlist expressions (``tux[0-3,12],s1``).

Expansion uses python-hostlist (NSC, PyPI ``python-hostlist``), which implements Slurm's
bracket syntax (slurm.conf(5), "NodeName"), so no ``scontrol`` process is needed.
Compression is done here: python-hostlist's ``collect_hostlist`` takes ~35 ms for 16,384
names (most of ``generate --format tree`` on a large fabric) and may emit several
bracket groups (``r[0-1]n[0-31]``); this one writes one bracket group per name prefix
(``gpu[00001-16384]``), keeps zero padding, and is checked against python-hostlist's
expansion in the tests.
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


_DIGITS = "0123456789"


def compress(names):
    """Host names (iterable of str) -> one hostlist expression, sorted and deterministic.

    Names ending in digits are grouped by prefix and zero padding (``n01``..``n10`` ->
    ``n[01-10]``; ``n9``, ``n10`` -> ``n[9-10]``); other names are listed as they are.
    """
    names = set(names)
    if not names:
        return ""
    plain, numbered, padded = [], [], {}
    for name in names:
        prefix = name.rstrip(_DIGITS)
        if len(prefix) == len(name):
            plain.append(name)
            continue
        digits = name[len(prefix):]
        numbered.append((prefix, digits))
        if len(digits) > 1 and digits[0] == "0":
            padded.setdefault(prefix, set()).add(len(digits))
    bad = {p for p, _ in numbered if "[" in p or "]" in p or "," in p}
    if bad:  # not a plain name: list such names as they are
        plain += [p + d for p, d in numbered if p in bad]
        numbered = [(p, d) for p, d in numbered if p not in bad]
    groups = {}
    for prefix, digits in numbered:
        widths = padded.get(prefix)
        width = len(digits) if widths and len(digits) in widths else 0
        groups.setdefault((prefix, width), []).append(int(digits))
    parts = [(name, name) for name in plain]
    for (prefix, width), numbers in groups.items():
        numbers.sort()
        ranges, start, prev = [], numbers[0], numbers[0]
        for number in numbers[1:]:
            if number != prev + 1:
                ranges.append((start, prev))
                start = number
            prev = number
        ranges.append((start, prev))
        fmt = "%%0%dd" % width if width else "%d"
        text = ",".join(fmt % a if a == b else (fmt + "-" + fmt) % (a, b) for a, b in ranges)
        first = prefix + fmt % numbers[0]
        if len(numbers) == 1:
            parts.append((first, first))
        else:
            parts.append((first, "%s[%s]" % (prefix, text)))
    from .model import natural_key
    return ",".join(expr for _, expr in sorted(parts, key=lambda p: (natural_key(p[0]), p[0])))
