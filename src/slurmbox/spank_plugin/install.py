"""Build the SPANK shim against the installed Slurm and install the launcher.

The shim is compiled with strict flags against ``/usr/include/slurm/spank.h``
(package libslurm-dev). The launcher is installed as a standalone script whose
interpreter line runs Python isolated and without site packages
(``#!PYTHON -IS``), so nothing in the job's environment (PYTHONPATH, user site)
changes what it runs.
"""

import os
import subprocess
import sys

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurmbox_spank.c")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER_SOURCE = os.path.join(_PACKAGE, "step", "launcher.py")
FRAMING_SOURCE = os.path.join(_PACKAGE, "sandbox", "framing.py")
#: The launcher's one import of slurmbox, replaced by framing.py's text when it is installed.
FRAMING_IMPORT = "from slurmbox.sandbox.framing import "
STRICT_FLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-Wformat=2", "-Wshadow", "-fPIC", "-shared",
                "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong", "-Wl,-z,relro,-z,now"]


class BuildError(RuntimeError):
    """The compiler failed; the message carries its output."""


def build_plugin(output, compiler="gcc"):
    """Compile the shim to ``output`` (a .so path). Raises BuildError."""
    os.makedirs(os.path.dirname(output), exist_ok=True)
    result = subprocess.run([compiler, *STRICT_FLAGS, "-o", output, SOURCE], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError("building %s failed:\n%s%s" % (SOURCE, result.stdout, result.stderr))
    os.chmod(output, 0o755)
    return output


def install_launcher(destination, python=None):
    """Write the launcher script to ``destination`` (mode 0755) for interpreter ``python``: the
    launcher with sandbox/framing.py inlined, so it runs with ``-IS`` and nothing else."""
    python = python or sys.executable
    with open(LAUNCHER_SOURCE) as handle:
        lines = handle.read().splitlines(keepends=True)
    with open(FRAMING_SOURCE) as handle:
        framing = handle.read()
    imports = [n for n, line in enumerate(lines) if line.startswith(FRAMING_IMPORT)]
    if len(imports) != 1:
        raise BuildError("%s must import slurmbox.sandbox.framing on exactly one line" % LAUNCHER_SOURCE)
    lines[imports[0]] = framing
    body = "".join(lines)
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    tmp = destination + ".tmp"
    with open(tmp, "w") as handle:
        handle.write("#!%s -IS\n" % python)
        handle.write(body)
    os.chmod(tmp, 0o755)
    os.replace(tmp, destination)
    return destination


def install(prefix):
    """Build the shim and launcher under ``prefix`` (lib/, libexec/). Returns their paths."""
    plugin = build_plugin(os.path.join(prefix, "lib", "slurmbox_spank.so"))
    launcher = install_launcher(os.path.join(prefix, "libexec", "slurmbox-launch"))
    return {"plugin": plugin, "launcher": launcher, "python": sys.executable}
