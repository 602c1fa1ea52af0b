"""Slurm's own notations used in the site configuration: hostlists and time strings.

Standard library only. Sources: slurm.conf(5) ("NodeName" hostlist
expressions such as ``gpu[001-064]`` and ``rack[1-2]-n[1-4]``; "MaxTime" time
formats "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
"days-hours:minutes", "days-hours:minutes:seconds", and "INFINITE"/"UNLIMITED").
"""

import re

#: Largest number of names one hostlist may expand to (bounds untrusted input).
MAX_HOSTLIST_NAMES = 100000

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


class SyntaxProblem(ValueError):
    """The text is not valid Slurm syntax; the message says what is expected."""


def _split_top_level(text):
    """Split ``text`` on commas that are not inside brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise SyntaxProblem("unbalanced ']' in %r" % text)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise SyntaxProblem("unbalanced '[' in %r" % text)
    parts.append("".join(current))
    return parts


def _expand_one(item, budget):
    if not item or any(c.isspace() for c in item):
        raise SyntaxProblem("%r is not a host name" % item)
    return _expand_brackets(item, budget)


def _expand_brackets(item, budget):
    match = _BRACKET.search(item)
    if not match:
        if "[" in item or "]" in item:
            raise SyntaxProblem("unbalanced bracket in %r" % item)
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    numbers = []
    for part in match.group(1).split(","):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise SyntaxProblem("range %r in %r: expected N or N-M with decimal numbers" % (part, item))
        high = high if sep else low
        if int(high) < int(low):
            raise SyntaxProblem("range %r in %r goes downwards" % (part, item))
        if int(high) - int(low) + 1 > budget:
            raise SyntaxProblem("%r expands to more than %d names" % (item, MAX_HOSTLIST_NAMES))
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        numbers.extend("%0*d" % (width, n) for n in range(int(low), int(high) + 1))
    names = []
    for number in numbers:
        for rest in _expand_brackets(tail, budget):
            names.append(head + number + rest)
            if len(names) > budget:
                raise SyntaxProblem("%r expands to more than %d names" % (item, MAX_HOSTLIST_NAMES))
    return names


def expand_hostlist(text):
    """Expand a Slurm hostlist (``"gpu[001-003],cpu7"``) into names, in order.

    Zero-padded ranges keep their width (``[01-03]`` -> 01, 02, 03); several
    bracket groups in one name multiply out. Raises SyntaxProblem for empty
    names, unbalanced brackets, bad ranges or more than MAX_HOSTLIST_NAMES.
    """
    if not isinstance(text, str) or not text.strip():
        raise SyntaxProblem("expected a hostlist such as gpu[001-064]")
    names = []
    for item in _split_top_level(text.strip()):
        names.extend(_expand_one(item.strip(), MAX_HOSTLIST_NAMES - len(names)))
    return names


_TIME_FORMS = (
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d+)$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("h", "m", "s")),
    (re.compile(r"^(\d+)-(\d+)$"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"), ("d", "h", "m", "s")),
)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
INFINITE = -1


def time_seconds(value, bare_number_unit="minutes"):
    """Seconds of a Slurm time value.

    ``value``: an int (in ``bare_number_unit``: "minutes" as MaxTime,
    "seconds" as GraceTime) or a Slurm time string (see module doc); a string
    of digits alone also counts as minutes, as in Slurm. "INFINITE" and
    "UNLIMITED" give INFINITE (-1). Raises SyntaxProblem otherwise.
    """
    if isinstance(value, bool):
        raise SyntaxProblem("expected a number or a Slurm time string, got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise SyntaxProblem("expected a non-negative time, got %d" % value)
        return value * (60 if bare_number_unit == "minutes" else 1)
    if not isinstance(value, str):
        raise SyntaxProblem("expected a number or a Slurm time string such as 30, 1:30:00 or 2-00:00:00")
    text = value.strip()
    if text.upper() in ("INFINITE", "UNLIMITED"):
        return INFINITE
    for pattern, units in _TIME_FORMS:
        match = pattern.match(text)
        if match:
            return sum(int(number) * _UNIT_SECONDS[unit] for number, unit in zip(match.groups(), units))
    raise SyntaxProblem("%r is not a Slurm time: expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                        "D-HH:MM:SS or INFINITE" % value)


def format_time(seconds):
    """Slurm time string of ``seconds`` (``D-HH:MM:SS`` or ``HH:MM:SS``; -1 -> INFINITE)."""
    if seconds == INFINITE:
        return "INFINITE"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return "%d-%02d:%02d:%02d" % (days, hours, minutes, secs)
    return "%02d:%02d:%02d" % (hours, minutes, secs)


def parse_cpu_list(text):
    """CPU numbers of a cpuset(7) list (``"0-3,8"``) as a sorted list; "" gives [].

    Raises SyntaxProblem on anything else."""
    cpus = set()
    for part in filter(None, text.split(",")):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise SyntaxProblem("%r is not a CPU list such as 0-3,8" % text)
        high = high if sep else low
        if int(high) < int(low) or int(high) > 65535:
            raise SyntaxProblem("CPU range %r in %r is out of order or too large" % (part, text))
        cpus.update(range(int(low), int(high) + 1))
    return sorted(cpus)
