"""Find the regular node sections of ``ibnetdiscover`` output in bulk (one job: speed on
large fabrics; :mod:`.ibnetdiscover` does the reading and owns the format's rules).

On a fabric of thousands of hosts almost every section looks exactly as ibnetdiscover(8)
prints it ("TOPOLOGY FILE FORMAT"):

    vendid=0x2c9                                     switch section
    devid=0xd2f0
    sysimgguid=0x...
    switchguid=0x...(...)
    Switch  64 "S-<guid>"  # "<description>" enhanced port 0 lid 1 lmc 0
    [1]  "S-<guid>"[33]  # "<remote description>" lid 2 4xNDR
    ...

    vendid=0x2c9                                     host CA section, one cabled port
    devid=0x1021
    sysimgguid=0x...
    caguid=0x...
    Ca  1 "H-<guid>"  # "<description>"
    [1](<port guid>)  "S-<guid>"[33]  # lid 3 lmc 0 "<remote description>" lid 1 4xNDR

Such a section is read with a few whole-text operations that run in C (``str.split``,
``find``, ``count``) instead of a Python loop over its lines. What they give is what a
tree needs: the header fields and the idents its port lines name (port numbers and speeds
are read later, line by line, when links are asked for). Any other section -- a stray line
after the header, a blank line with spaces, a header with a quote in its description --
is handed back as text for the line-by-line reader, so an unusual file is read exactly as
before, only without the shortcut.
"""

import re
from sys import intern

_KINDS = ("Switch", "Ca", "Rt")
_SEP = "\x1e"  # joins pieces that each hold one line break
#: Pieces 4 of one-port-line sections joined by _SEP: in each, one break, then "[<port>]".
_SINGLE_LOCAL = re.compile(r"[^\n\x1e]*\n\[[0-9]+\][^\n\x1e]*(?:\x1e[^\n\x1e]*\n\[[0-9]+\][^\n\x1e]*)*")
#: The text between a section's port lines, joined: the header's end, then per line a
#: break, "[<port>]" and the line's text up to the remote ident / after the description.
_LOCAL_PORTS = re.compile(r"[^\n]*(?:\n\[[0-9]+\][^\n]*)*")
#: The texts after each remote ident, joined by line breaks: "[<remote port>]..." each.
_REMOTE_PORTS = re.compile(r"\[[0-9]+\][^\n]*(?:\n\[[0-9]+\][^\n]*)*")


def _regular_prefix(prefix, words):
    """True when a header's text before its first quote is ``Switch|Ca|Rt <port count>`` as
    the line-by-line reader takes it: at the start of the line (a line starting with white
    space is no header to it), a known kind, a port count."""
    return prefix.startswith(_KINDS) and len(words) == 2 and words[0] in _KINDS and words[1].isdecimal()


class RegularSections:
    """The regular sections of one text, and the rest.

    ``several``: list of (header text before its first quote, e.g. ``"Switch\t64 "``, ident,
    description, text after the description up to the first port line's remote ident,
    [remote idents of its port lines]) of the regular sections with no port line or
    several; ``single``: the same five fields as parallel lists (the last one of remote
    idents, str) for the sections with one port line (a host's CA, on most fabrics nearly
    every section). Idents are interned: each name is one string object, so the sets that
    trees are built from compare them by identity. ``rest``: the other sections' text,
    blank-line separated, in their order; ``port_lines_regular``: False when some section
    with port lines is not regular (then which cable a line names depends on the lines
    before it: read every line in order).
    """

    __slots__ = ("several", "single", "rest", "port_lines_regular")

    def __init__(self, several, single, rest, port_lines_regular):
        self.several, self.single, self.rest = several, single, rest
        self.port_lines_regular = port_lines_regular and "\n[" not in "\n" + rest


def _split_each(text):
    """Split ibnetdiscover ``text`` (str, newlines "\n") into :class:`RegularSections`.

    A section (text between blank lines) is regular when its header is the first line with
    a quote and every line after the header is a port line with four quotes, the second
    followed by "[" (``[<port>] "<remote ident>"[<remote port>] # "<remote description>"``,
    as ibnetdiscover prints switch and CA port lines alike). Lines before the header
    (attributes, comments, noise) are not looked at: they name no node and no cable.
    Sections without any quote name none either and are dropped.

    Each section is split at its quotes once: the header's ident and description are
    pieces 1 and 3, and the remote idents every fourth piece from 5 on. The checks are
    counts over the section and over joined pieces, so the cost does not grow with a
    Python step per line. (Not told apart: a port line without quotes next to one with
    eight whose description quotes an ident: this takes that ident as a remote too, the
    line-by-line reader does not. ibnetdiscover prints neither line.)
    """
    several, rest = [], []
    # Sections with one port line, as columns: header prefixes, idents, descriptions,
    # pieces 4 (header rest, break, "[<port>]..."), remote idents, pieces 6.
    prefixes_1, idents_1, descriptions_1, fourth_1, remotes_1, sixth_1 = [], [], [], [], [], []
    prefixes = {}  # header text before the first quote -> whether it is "Switch|Ca|Rt <ports> "
    sections = text.split("\n\n")
    sections[-1] = sections[-1].rstrip("\n")  # the text's final line break(s)
    for section in sections:
        parts = section.split('"')
        count = len(parts)
        if count < 5:
            if count > 1:
                rest.append(section)
            continue  # no quote: no header, no port line, nothing a reader would keep
        before = parts[0]
        prefix = before[before.rfind("\n") + 1:]
        regular = prefixes.get(prefix)
        if regular is None:
            words = prefix.split()
            regular = prefixes[prefix] = _regular_prefix(prefix, words)
        # The line breaks after the header's start: one per port line.
        lines = section.count("\n", len(before))
        if not regular or count != 5 + 4 * lines:
            rest.append(section)
        elif lines == 1:  # a host's CA: its port line is checked with all the others below
            prefixes_1.append(prefix)
            idents_1.append(parts[1])
            descriptions_1.append(parts[3])
            fourth_1.append(parts[4])
            remotes_1.append(parts[5])
            sixth_1.append(parts[6])
        elif lines == 0:
            several.append((prefix, intern(parts[1]), parts[3], parts[4], []))
        else:
            # All breaks in the pieces between lines (4, 8, ...), each followed by
            # "[<port>]"; then the pieces after the remote idents (6, 10, ...) hold none, and
            # joined by one they all start with "[<remote port>]".
            between = "".join(parts[4::4])
            if (between.count("\n") != lines or _LOCAL_PORTS.fullmatch(between) is None
                    or _REMOTE_PORTS.fullmatch("\n".join(parts[6::4])) is None):
                rest.append(section)
                continue
            several.append((prefix, intern(parts[1]), parts[3], parts[4], list(map(intern, parts[5::4]))))
    # Each one-line section's piece 4 holds its one line break (so piece 6 none), then
    # "[<port>]"; piece 6 starts with "[<remote port>]". Checked for all at once; should
    # one fail, all of them count as irregular (the reader then reads every line anyway).
    joined = _SEP.join(fourth_1)
    if fourth_1 and (joined.count(_SEP) != len(fourth_1) - 1 or _SINGLE_LOCAL.fullmatch(joined) is None
                     or _REMOTE_PORTS.fullmatch("\n".join(sixth_1)) is None):
        return RegularSections((), ([], [], [], [], []), text, False)
    single = (prefixes_1, list(map(intern, idents_1)), descriptions_1, fourth_1, list(map(intern, remotes_1)))
    return RegularSections(several, single, "\n\n".join(rest), True)


def split_sections(text):
    """Split ibnetdiscover ``text`` (str, newlines "\n") into :class:`RegularSections`.

    ibnetdiscover prints its switches first, then its CAs. When everything from the first
    CA section on is host CAs with one port line each (a single-rail fabric), that run is
    read as one piece (:func:`_host_run`); everything else, or everything when the run is
    not like that, section by section (:func:`_split_each`). Both take the same sections
    as regular and give the same fields.
    """
    first = text.find("\nCa\t") + 1 if not text.startswith("Ca\t") else 0
    if first > 0:
        start = text.rfind("\n\n", 0, first)
        start = 0 if start < 0 else start + 2
        run = _host_run(text[start:])
        if run is not None:
            regular = _split_each(text[:start]) if start else RegularSections([], ([], [], [], [], []), "", True)
            if regular.port_lines_regular:
                for column, more in zip(regular.single, run):
                    column += more
            return regular
    return _split_each(text)


def _host_run(run):
    """The five columns of RegularSections.single for ``run``, text made only of host CA
    sections with one port line each, or None when it is not.

    Split at its quotes, such a run gives eight pieces per section: ident, the text between
    ident and description, description, the header's end with the line break and the
    port line up to the remote ident, remote ident, the text up to the remote description,
    remote description, and the rest of the port line up to the next header's first
    quote (attribute lines, blank lines and anything else without quotes; a line-by-line
    reader keeps nothing from those). Counts and regular expressions over the joined
    pieces check that every section is one header line of four quotes and one port line
    of four quotes, "[<port>]" and "[<remote port>]" where a reader expects numbers.
    """
    sections = run.count("\nCa\t") + run.startswith("Ca\t")
    pieces = run.split('"')
    if not sections or len(pieces) != 8 * sections + 1:
        return None
    fourth = pieces[4::8]
    # Line breaks only in pieces 0 (mod 8) and, exactly one each, in pieces 4.
    if "\n" in "".join(pieces[1::8] + pieces[2::8] + pieces[3::8] + pieces[5::8] + pieces[6::8] + pieces[7::8]):
        return None
    joined = _SEP.join(fourth)
    if (joined.count(_SEP) != sections - 1 or _SINGLE_LOCAL.fullmatch(joined) is None
            or _REMOTE_PORTS.fullmatch("\n".join(pieces[6::8])) is None):
        return None
    # Each header's text before its first quote: the last line of the piece before it.
    prefixes = [piece[piece.rfind("\n") + 1:] for piece in pieces[0:-1:8]]
    for prefix in set(prefixes):
        words = prefix.split()
        if not _regular_prefix(prefix, words):
            return None
    return (prefixes, list(map(intern, pieces[1::8])), pieces[3::8], fourth, list(map(intern, pieces[5::8])))


def split_stream(chunks):
    """:func:`split_sections` of the text made of ``chunks`` (iterable of str, e.g. a file
    read 1 MiB at a time), read block by block: each block ends at a blank line, so no
    section is cut. A large file is never held whole (one 10 MB string costs about as much
    as reading the file line by line). On an irregular section with port lines the result
    has ``port_lines_regular`` False and nothing else: the caller reads it all line by line.
    """
    several, single, rest = [], ([], [], [], [], []), []
    for block in _blocks(chunks):
        regular = split_sections(block)
        if not regular.port_lines_regular:
            return RegularSections((), ([], [], [], [], []), "", False)
        several += regular.several
        for column, more in zip(single, regular.single):
            column += more
        if regular.rest:
            rest.append(regular.rest)
    return RegularSections(several, single, "\n\n".join(rest), True)


def _blocks(chunks):
    """The text of ``chunks`` again, as pieces that each end at a blank line (or the end)."""
    carry = ""
    for chunk in chunks:
        text = carry + chunk if carry else chunk
        cut = text.rfind("\n\n")
        if cut < 0:
            carry = text
            continue
        yield text[:cut]
        carry = text[cut + 2:]
    if carry:
        yield carry
