"""Replacing a file atomically without ever writing through a planted symlink.

Root-run tools (``slurmbox config render``, ``slurmbox measure run``) write into
directories that other users may be able to write; a fixed temporary name there
could be a symlink planted to make root overwrite another file.
"""

import contextlib
import os
import tempfile


@contextlib.contextmanager
def replace_atomically(path, mode=0o644):
    """Yield a binary file object whose content replaces ``path`` when the block ends normally.

    The data goes to a new temporary file in ``path``'s directory, created with O_EXCL
    under a random name (tempfile.mkstemp) and written through its descriptor, with
    permission bits ``mode``; rename(2) then puts it in place, so readers never see half
    a file and a symlink at ``path`` is replaced, never followed. When the block raises,
    the temporary file is removed and the exception passes through. Raises OSError.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w+b") as stream:
            os.fchmod(stream.fileno(), mode)
            yield stream
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
