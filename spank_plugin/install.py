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
LAUNCHER_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sandbox", "launcher.py")
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
    """Write the launcher script to ``destination`` (mode 0755) for interpreter ``python``."""
    python = python or sys.executable
    with open(LAUNCHER_SOURCE) as handle:
        body = handle.read()
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    tmp = destination + ".tmp"
    with open(tmp, "w") as handle:
        handle.write("#!%s -IS\n" % python)
        handle.write(body)
    os.chmod(tmp, 0o755)
    os.replace(tmp, destination)
    return destination


def plugstack_line(plugin, python, launcher, runtime_dir, site_config=None, required_partitions=()):
    """The plugstack.conf line (spank(8): ``required PATH ARGS``) for the shim."""
    args = ["python=%s" % python, "launcher=%s" % launcher, "runtime_dir=%s" % runtime_dir]
    if site_config:
        args.append("site_config=%s" % site_config)
    if required_partitions:
        args.append("required_partitions=%s" % ",".join(required_partitions))
    return "required %s %s\n" % (plugin, " ".join(args))


def install(prefix):
    """Build the shim and launcher under ``prefix`` (lib/, libexec/). Returns their paths."""
    plugin = build_plugin(os.path.join(prefix, "lib", "slurmbox_spank.so"))
    launcher = install_launcher(os.path.join(prefix, "libexec", "slurmbox-launch"))
    return {"plugin": plugin, "launcher": launcher, "python": sys.executable}
