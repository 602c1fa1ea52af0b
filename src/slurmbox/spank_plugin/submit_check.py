"""Submit-time refusal of transparent checkpoints that cannot save a job's GPUs.

The SPANK shim runs this in the submitting command, as the submitting user,
from ``slurm_spank_init_post_opt`` (spank(7): allocator context = sbatch and
salloc, local context = srun; called after option parsing, before the job is
queued)::

    python -I -m slurmbox.spank_plugin.submit_check --pid PID \\
        [--site-config PATH] [--required-partitions P1,P2] [--option KEY=VALUE ...]

``--pid`` is the submitting process: its argv (``/proc/PID/cmdline``), its
input environment (``/proc/PID/environ``), its working directory and, for
sbatch, the ``#SBATCH`` directives of the batch script named on its command
line are read here. ``--option`` carries the shim's effective ``--sandbox*``
values (command line, directives and ``SLURM_SPANK_*`` already applied by
Slurm), keyed as the supervisor gets them (``checkpoint=transparent``).

A job is refused (exit status 1, the reason and what to do on stderr) when
it would run in a sandbox (an option, ``SLURMBOX_SANDBOX``, or a partition
that requires one), asks for GPUs (``--gres=gpu...``, ``--gpus``/``-G``,
``--gpus-per-node``/``-socket``/``-task``, ``--tres-per-task=gres/gpu...``,
their ``SBATCH_*``/``SALLOC_*``/``SLURM_*`` input variables, ``#SBATCH``
lines), its checkpoint mode is transparent, and gVisor cannot save the GPUs'
state there: the partition's accelerators (site configuration) are AMD, TPU
or Trainium, or the installed runsc has no CUDA checkpoint flag. The decision
is slurmbox.migrate.policy.refuse_gpu_transparent's, the same the supervisor
applies when the step starts (which stays the authoritative check, and alone
sees the node's side: its cuda-checkpoint, the sandbox image and mounts): jobs are
refused for an explicit ``--sandbox-checkpoint=transparent`` and for the site
default on a preemptible partition, except that salloc (its allocation runs no
checkpointed step) and an srun step that the supervisor would not checkpoint
anyway (several tasks per node, ``--pty``, ``--multi-prog``) are refused only
for the explicit request.

Anything this module cannot interpret (an unknown option, a heterogeneous
job, a script read from stdin, a step inside an existing allocation) makes
it say nothing (exit 0): the step start still refuses. An internal failure is
a warning on stderr and exit 0, never a blocked submission. Standard library
plus slurmbox.settings.compiled and slurmbox.migrate.policy only (no
pydantic unless the compiled site policy cache must be rebuilt).

Option tables: Slurm 22.05 ``src/common/slurm_opt.c`` (``has_arg`` of every
sbatch/salloc/srun option; ``slurm_option_table_create`` builds a getopt_long
string starting with ``+``), input variables: ``src/sbatch/opt.c``,
``src/salloc/opt.c``, ``src/srun/libsrun/opt.c`` ``env_vars``; precedence
(sbatch: directives < environment < command line) and directive syntax
(``get_argument``): ``src/sbatch/opt.c``.
"""

import os
import sys

# Every sbatch/salloc/srun of a site with sandbox-required partitions starts this module: the standard
# library modules needed only for GPU jobs (re, subprocess, shutil, dataclasses) are imported where used.

NO_ARG, REQUIRED, OPTIONAL = 0, 1, 2

_LONG_NO_ARG = """
    bell contiguous debugger-test disable-status exact help hold ignore-pbs interactive label
    multi-prog no-allocate no-bell no-requeue no-shell overcommit oversubscribe parsable
    preserve-env pty quiet quit-on-interrupt reboot requeue spread-job test-only unbuffered
    usage use-min-nodes verbose version whole
    no-sandbox sandbox-dry-run
"""
_LONG_REQUIRED = """
    accel-bind account acctg-freq array batch bb bbf bcast-exclude begin chdir cluster
    cluster-constraint clusters comment constraint container context core-spec cores-per-socket
    cpu-bind cpu-freq cpu_bind cpus-per-gpu cpus-per-task deadline delay-boot dependency
    distribution epilog error exclude export export-file extra-node-info gid gpu-bind gpu-freq
    gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags het-group hint input
    job-name jobid kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind
    mem-per-cpu mem-per-gpu mincpus mpi msg-timeout network nodefile nodelist nodes ntasks
    ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres open-mode
    output pack-group partition power prefer priority profile prolog qos relative reservation
    signal slurmd-debug sockets-per-node switches task-epilog task-prolog tasks-per-node
    thread-spec threads threads-per-core time time-min tmp uid wait-all-nodes wckey wrap
    tres-per-task
    sandbox-image sandbox-mounts sandbox-workdir sandbox-network sandbox-checkpoint
    sandbox-checkpoint-interval
"""
_LONG_OPTIONAL = """
    bcast compress exclusive get-user-env immediate kill-command kill-on-bad-exit nice no-kill
    overlap propagate resv-ports send-libs x11
    sandbox
"""
#: Long options of Slurm 22.05 a command does not have (slurm_opt.c set_func_<command>).
_NOT_IN = {
    "sbatch": """accel-bind bcast bcast-exclude bell compress cpu-bind cpu_bind debugger-test disable-status
        epilog exact het-group immediate interactive jobid kill-command kill-on-bad-exit label mpi msg-timeout
        multi-prog no-allocate no-bell no-shell overlap pack-group preserve-env prolog pty quit-on-interrupt
        relative resv-ports send-libs slurmd-debug task-epilog task-prolog threads unbuffered whole x11""",
    "salloc": """accel-bind array batch bcast bcast-exclude compress cpu-bind cpu_bind debugger-test
        disable-status epilog error exact export export-file het-group ignore-pbs input interactive jobid
        kill-on-bad-exit kill-on-invalid-dep label mpi msg-timeout multi-prog no-allocate no-requeue open-mode
        output overlap pack-group parsable preserve-env prolog propagate pty quit-on-interrupt relative requeue
        resv-ports send-libs slurmd-debug task-epilog task-prolog test-only threads unbuffered wait whole wrap""",
    "srun": """array batch bell export-file get-user-env ignore-pbs kill-command kill-on-invalid-dep no-bell
        no-requeue no-shell parsable requeue wait-all-nodes wrap""",
}
#: ``--wait`` differs: sbatch has it without an argument, srun with one, salloc not at all.
_COMMAND_ONLY = {"sbatch": {"wait": NO_ARG}, "srun": {"wait": REQUIRED}, "salloc": {}}
#: getopt short option strings (slurm_option_table_create; ':' = argument, '::' = optional).
_SHORT = {
    "sbatch": "A:B:C:D:F:G:HJ:L:M:N:OQS:VWa:b:c:d:e:hi:k::m:n:o:p:q:st:vw:x:",
    "salloc": "A:B:C:D:F:G:HI::J:K::L:M:N:OQS:Vb:c:d:hk::m:n:p:q:st:vw:x:",
    "srun": "A:B:C:D:EF:G:HI::J:K::L:M:N:OQS:T:VW:XZb:c:d:e:hi:k::lm:n:o:p:q:r:st:uvw:x:",
}
#: Short options this check reads, by their long name.
_SHORT_NAMES = {"G": "gpus", "p": "partition", "D": "chdir", "n": "ntasks", "N": "nodes"}
#: Options that ask for GPUs (their values are GPU counts, see gpu_count).
GPU_OPTIONS = ("gres", "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "tres-per-task")
#: Options read here; every other option is only skipped over.
READ_OPTIONS = GPU_OPTIONS + ("partition", "jobid", "chdir", "wrap", "ntasks", "ntasks-per-node", "nodes", "pty",
                               "multi-prog")
#: Input environment variable prefix per command (env_vars tables of Slurm 22.05).
ENV_PREFIX = {"sbatch": "SBATCH_", "salloc": "SALLOC_", "srun": "SLURM_"}
ENV_OPTIONS = {"GRES": "gres", "GPUS": "gpus", "GPUS_PER_NODE": "gpus-per-node",
               "GPUS_PER_SOCKET": "gpus-per-socket", "GPUS_PER_TASK": "gpus-per-task",
               "TRES_PER_TASK": "tres-per-task", "PARTITION": "partition"}
#: srun's task-count input variables (srun reads SLURM_NTASKS, SLURM_NPROCS, SLURM_NTASKS_PER_NODE).
SRUN_ENV_OPTIONS = {"NPROCS": "ntasks", "NTASKS": "ntasks", "NTASKS_PER_NODE": "ntasks-per-node"}
#: Read at most this many bytes of a batch script for its directives.
SCRIPT_READ_LIMIT = 1 << 20
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VENDOR_NAMES = {"nvidia": "NVIDIA GPUs", "amd": "AMD GPUs", "tpu": "TPUs", "trainium": "Trainium devices"}


class Unsupported(Exception):
    """Input this check cannot interpret; it then says nothing and the step start decides."""


def option_table(command):
    """``{long option name: NO_ARG|REQUIRED|OPTIONAL}`` of ``command`` (sbatch, salloc, srun), slurmbox's
    SPANK options included. Raises Unsupported for another command."""
    if command not in _SHORT:
        raise Unsupported("not sbatch, salloc or srun: %s" % command)
    table = {}
    for kind, names in ((NO_ARG, _LONG_NO_ARG), (REQUIRED, _LONG_REQUIRED), (OPTIONAL, _LONG_OPTIONAL)):
        table.update(dict.fromkeys(names.split(), kind))
    for name in _NOT_IN[command].split():
        table.pop(name, None)
    table.update(_COMMAND_ONLY[command])
    return table


def short_table(command):
    """``{short option letter: NO_ARG|REQUIRED|OPTIONAL}`` of ``command`` (getopt string syntax)."""
    spec, table = _SHORT[command], {}
    for index, char in enumerate(spec):
        if char != ":":
            table[char] = len(spec[index + 1:]) - len(spec[index + 1:].lstrip(":"))
    return table


def _long_name(text, table):
    """getopt_long(3) lookup: an exact name, or an unambiguous prefix of one."""
    if text in table:
        return text
    matches = [name for name in table if name.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    raise Unsupported("unknown or ambiguous option --%s" % text)


def parse_options(command, args):
    """Options of ``command`` in ``args`` (argv without argv[0]) as getopt_long with a leading ``+`` reads
    them: ``(options, operands)``, options a list of ``(long name, value)`` in order for READ_OPTIONS only
    (short letters mapped to long names), operands the arguments from the first non-option on.

    Raises Unsupported for an option not in the tables (another plugin's, a newer Slurm's), a missing
    argument, or a heterogeneous job separator ``:``.
    """
    longs, shorts = option_table(command), short_table(command)
    found, index = [], 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == ":":
            raise Unsupported("heterogeneous job")
        if arg == "--":
            return found, list(args[index:])
        if arg.startswith("--"):
            text, eq, value = arg[2:].partition("=")
            name = _long_name(text, longs)
            kind = longs[name]
            if eq and kind == NO_ARG:
                raise Unsupported("--%s takes no argument" % name)
            if not eq and kind == REQUIRED:
                if index >= len(args):
                    raise Unsupported("--%s needs an argument" % name)
                value, index = args[index], index + 1
            elif not eq:
                value = None
            if name in READ_OPTIONS:
                found.append((name, value))
            continue
        if arg.startswith("-") and len(arg) > 1:
            position = 1
            while position < len(arg):
                letter = arg[position]
                position += 1
                if letter not in shorts:
                    raise Unsupported("unknown option -%s" % letter)
                kind, value = shorts[letter], None
                if kind != NO_ARG:
                    value = arg[position:] or None
                    position = len(arg)
                    if value is None and kind == REQUIRED:
                        if index >= len(args):
                            raise Unsupported("-%s needs an argument" % letter)
                        value, index = args[index], index + 1
                name = _SHORT_NAMES.get(letter)
                if name:
                    found.append((name, value))
            continue
        return found, list(args[index - 1:])
    return found, []


def split_directive(text):
    """The arguments on one ``#SBATCH`` line after the magic word (Slurm 22.05 sbatch get_argument):
    whitespace separates, single or double quotes group, a backslash escapes, an unescaped ``#`` starts
    a comment. Raises Unsupported for an unmatched quote (sbatch itself refuses the script)."""
    words, current, quote, escape, started = [], [], None, False, False
    for char in text:
        if escape:
            current.append(char)
            escape, started = False, True
        elif char == "\\":
            escape, started = True, True
        elif quote:
            if char == quote:
                quote = None
            else:
                current.append(char)
        elif char in "\"'":
            quote, started = char, True
        elif char == "#":
            break
        elif char.isspace():
            if started:
                words.append("".join(current))
                current, started = [], False
        else:
            current.append(char)
            started = True
    if quote:
        raise Unsupported("unmatched quote in a directive")
    if started:
        words.append("".join(current))
    return words


def script_directives(body, where="script"):
    """``[(long name, value, where)]`` of the ``#SBATCH`` (and ``#SLURM``) lines of batch script text
    ``body``, read as sbatch reads them: from the top, up to the first line that is a command.
    Raises Unsupported for a heterogeneous job script or an option this check does not know."""
    found = []
    for lineno, line in enumerate(body.splitlines(), 1):
        for magic in ("#SBATCH", "#SLURM"):
            if line.startswith(magic):
                words = split_directive(line[len(magic):])
                if words and words[0].lower() in ("hetjob", "packjob"):
                    raise Unsupported("heterogeneous job script")
                options, operands = parse_options("sbatch", words)
                found.extend((name, value, "%s line %d" % (where, lineno)) for name, value in options)
                break
        else:
            stripped = line.strip()
            if stripped and not stripped.startswith("#"):
                break
    return found


def _count(text):
    import re

    match = re.match(r"^(\d+)([kKmMgG]?)$", text)
    if not match:
        return None
    return int(match.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}[match.group(2).lower()]


def gpu_count(option, value):
    """How many GPUs ``--OPTION=VALUE`` asks for (int; 0 = none). ``gres`` and ``tres-per-task``:
    comma lists of ``[gres/]NAME[:TYPE][:COUNT]`` (count 1 when omitted; only NAME ``gpu`` counts;
    ``none`` clears); the ``gpus*`` options: comma lists of ``[TYPE:]COUNT`` (sbatch(1), srun(1))."""
    import re

    if value is None or option not in GPU_OPTIONS:
        return 0
    total = 0
    for item in value.split(","):
        item = re.sub(r"\(.*\)$", "", item.strip())
        if not item or item.lower() == "none":
            continue
        parts = item.split(":")
        if option in ("gres", "tres-per-task"):
            name = parts[0][len("gres/"):] if parts[0].startswith("gres/") else parts[0]
            if name != "gpu" or (option == "tres-per-task" and not parts[0].startswith("gres/")):
                continue
            count = _count(parts[-1]) if len(parts) > 1 else 1
            total += 1 if count is None else count  # a TYPE without a count asks for one
        else:
            count = _count(parts[-1])
            total += 1 if count is None else count
    return total


class Request:
    """What a submission asks for: ``command`` (sbatch, salloc, srun), ``gpus`` (``[(option, value,
    where)]`` with a non-zero GPU count), ``partitions`` (names; empty = the cluster's default),
    ``partition_source`` (where the partition came from), ``existing_job`` (a step of a running job),
    ``checkpointable_step`` (srun: surely one task per node, no ``--pty``, no ``--multi-prog``: a step
    the supervisor can checkpoint, see slurmbox.migrate.step_checkpoint)."""

    def __init__(self, command, gpus, partitions, partition_source="", existing_job=False,
                 checkpointable_step=True):
        self.command, self.gpus, self.partitions = command, gpus, partitions
        self.partition_source, self.existing_job = partition_source, existing_job
        self.checkpointable_step = checkpointable_step

    def __repr__(self):
        return "Request(%r, gpus=%r, partitions=%r, existing_job=%r)" % (
            self.command, self.gpus, self.partitions, self.existing_job)


def _effective(entries, name):
    """The last ``(value, where)`` of option ``name`` among ``entries`` (in precedence order) or None."""
    last = None
    for option, value, where in entries:
        if option == name:
            last = (value, where)
    return last


def _one_task_per_node(entries):
    """True when srun's options surely give one task per node (srun(1): without -n, one task per node)."""
    per_node = _effective(entries, "ntasks-per-node")
    if per_node is not None:
        return per_node[0] == "1"
    ntasks = _effective(entries, "ntasks")
    if ntasks is None:
        return True
    nodes = _effective(entries, "nodes")
    try:
        count = int(ntasks[0])
        fewest_nodes = int((nodes[0] if nodes else "1").split("-")[0])
    except ValueError:
        return False
    return count <= max(fewest_nodes, 1)


def read_request(command, argv, env, script_reader=None):
    """The Request of ``command`` run with ``argv`` (argv[0] included) and input environment ``env``.

    ``script_reader(path, chdir)`` returns the batch script's text or None (sbatch only; without it,
    directives are not read). Raises Unsupported when the request cannot be read (see parse_options;
    an sbatch script on stdin or unreadable).
    """
    options, operands = parse_options(command, list(argv[1:]))
    cmdline = [(name, value, "command line") for name, value in options]
    prefix = ENV_PREFIX[command]
    known = dict(ENV_OPTIONS, **(SRUN_ENV_OPTIONS if command == "srun" else {}))
    environment = [(name, env[prefix + key], "%s%s" % (prefix, key))
                   for key, name in known.items() if env.get(prefix + key)]
    entries = environment + cmdline
    if command == "sbatch" and _effective(cmdline, "wrap") is None:
        if not operands or operands[0] == "-" or script_reader is None:
            raise Unsupported("batch script on stdin: its directives cannot be read")
        chdir = _effective(cmdline, "chdir")
        body = script_reader(operands[0], chdir[0] if chdir else None)
        if body is None:
            raise Unsupported("cannot read the batch script %s" % operands[0])
        entries = script_directives(body, os.path.basename(operands[0])) + entries
    existing = command == "srun" and (bool(env.get("SLURM_JOB_ID")) or _effective(entries, "jobid") is not None)
    gpus = []
    for name in GPU_OPTIONS:
        last = _effective(entries, name)
        if last and gpu_count(name, last[0]) > 0:
            gpus.append((name, last[0], last[1]))
    partition = _effective(entries, "partition")
    partitions = [p for p in (partition[0] or "").split(",") if p] if partition else []
    checkpointable = command != "srun" or (_one_task_per_node(entries) and _effective(entries, "pty") is None
                                           and _effective(entries, "multi-prog") is None)
    return Request(command, gpus, partitions, partition[1] if partition else "", existing, checkpointable)


# -- the submitting process --------------------------------------------------------------------------

def process_argv(pid):
    """argv (list of str) of process ``pid`` from ``/proc/PID/cmdline`` (proc(5))."""
    with open("/proc/%d/cmdline" % pid, "rb") as handle:
        raw = handle.read()
    return [os.fsdecode(part) for part in raw.split(b"\0")[:-1]]


def process_environ(pid):
    """The environment process ``pid`` started with (dict), from ``/proc/PID/environ`` (proc(5))."""
    with open("/proc/%d/environ" % pid, "rb") as handle:
        raw = handle.read()
    env = {}
    for entry in raw.split(b"\0"):
        key, eq, value = entry.partition(b"=")
        if eq:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def process_command(pid, argv):
    """``sbatch``, ``salloc`` or ``srun``: the basename of ``/proc/PID/exe``, else of argv[0]."""
    try:
        name = os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        name = ""
    if name not in _SHORT and argv:
        name = os.path.basename(argv[0])
    return name


def script_reader_for(pid, env):
    """A ``(path, chdir) -> text or None`` reader of batch scripts as sbatch ``pid`` finds them: relative
    to its working directory (or ``--chdir``), else on its PATH; at most SCRIPT_READ_LIMIT bytes."""
    try:
        cwd = os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        cwd = os.getcwd()

    def read(path, chdir):
        candidates = [path] if os.path.isabs(path) else [os.path.join(cwd, path)]
        if not os.path.isabs(path):
            if chdir:
                candidates.append(os.path.join(cwd, chdir, path))
            if "/" not in path:
                candidates += [os.path.join(d, path) for d in env.get("PATH", "").split(":") if d]
        for candidate in candidates:
            try:
                with open(candidate, "rb") as handle:
                    return handle.read(SCRIPT_READ_LIMIT).decode("utf-8", "replace")
            except OSError:
                continue
        return None
    return read


# -- site facts ----------------------------------------------------------------------------------------

def default_partition(env):
    """Name of the cluster's default partition (slurm_client.scontrol.default_partition) or None
    when slurmctld cannot be asked (the step side decides then)."""
    from slurmbox.slurm_client import scontrol

    run_env = {"PATH": ROOT_PATH, "LANG": "C.UTF-8"}
    if env.get("SLURM_CONF"):
        run_env["SLURM_CONF"] = env["SLURM_CONF"]
    try:
        return scontrol.default_partition(env=run_env)
    except scontrol.SlurmCommandError:
        return None


def load_site_policy(site_config):
    """The compiled SitePolicy of ``site_config`` (slurmbox.settings.compiled.load_policy), its cache
    kept in the user's ``$XDG_CACHE_HOME/slurmbox`` (default ``~/.cache/slurmbox``); where that cannot be
    written, compiled in memory. Raises OSError / SiteConfigError as load_policy does."""
    from slurmbox.settings import compiled

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    try:
        return compiled.load_policy(site_config, os.path.join(base, "slurmbox"))
    except OSError:  # the cache directory cannot be written (no home, read-only, full)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="slurmbox-policy-") as scratch:
            return compiled.load_policy(site_config, scratch)


def runsc_checkpoint_help():
    """``(path, version, help text)`` of the installed runsc (fixed root PATH), or None when absent."""
    import shutil

    runsc = shutil.which("runsc", path=ROOT_PATH)
    if not runsc:
        return None
    from slurmbox.sandbox.runsc import help_text

    env = {"PATH": ROOT_PATH, "LANG": "C.UTF-8"}
    version = help_text(runsc, "--version", env=env).splitlines()
    return runsc, (version[0].replace("runsc version ", "") if version else "unknown"), \
        help_text(runsc, "checkpoint", "--help", env=env)


# -- the decision --------------------------------------------------------------------------------------

def _truthy(value):
    return bool(value) and value != "0" and value.lower() not in ("no", "false")


def sandboxed(options, env, partition, required_partitions, partition_policy):
    """Whether the job's steps on ``partition`` run in a sandbox, as the shim and supervisor decide:
    a ``--sandbox*`` option or ``SLURMBOX_SANDBOX`` asks, a required partition insists, ``--no-sandbox``
    declines where allowed, a forbidden partition never runs one."""
    if getattr(partition_policy, "sandbox", "optional") == "forbidden":
        return False
    required = partition in required_partitions or getattr(partition_policy, "sandbox", "") == "required"
    if "no-sandbox" in options:
        return required
    asked = any(key != "no-sandbox" for key in options) or _truthy(env.get("SLURMBOX_SANDBOX", ""))
    return asked or required


def refusal(request, options, env, site, required_partitions, runsc_info, default=None):
    """The refusal message (str) for ``request``, or None to let it through.

    ``options``: the shim's ``{key: value}`` (``checkpoint``, ``sandbox``...); ``env``: the input
    environment; ``site``: a SitePolicy; ``runsc_info``: a callable returning runsc_checkpoint_help()'s
    value (called only when needed); ``default``: a callable returning the default partition name.
    """
    import dataclasses

    from slurmbox.migrate import policy as ckpt_policy

    if not request.gpus or request.existing_job:
        return None
    partitions = request.partitions or ([default()] if default else [])
    partitions = [p for p in partitions if p]
    runsc = None
    for partition in partitions:
        part_policy = site.partition(partition)
        if not sandboxed(options, env, partition, required_partitions, part_policy):
            continue
        try:
            settings = ckpt_policy.resolve(options, env, part_policy)
        except ckpt_policy.CheckpointOptionError:
            continue  # a bad value: the step start names it
        if settings.mode != "transparent":
            continue
        if request.command == "salloc" or not request.checkpointable_step:
            # salloc's allocation runs no checkpointed step (its sruns are checked when they start); an srun
            # step with several tasks per node or a terminal runs without checkpoints under a site default.
            settings = dataclasses.replace(settings, preemptible=False)
        vendors = set(getattr(part_policy, "accelerator_vendors", ()) or ())
        try:  # even with a runsc that cannot save GPUs, would the policy refuse? If not, runsc is not asked.
            ckpt_policy.refuse_gpu_transparent(settings, vendors | {"amd"}, "")
            continue
        except ckpt_policy.CheckpointOptionError:
            pass
        unsupported = sorted(vendors - {"nvidia"})
        help_text, reason = "", None
        if unsupported:
            reason = "its nodes have %s, whose state gVisor cannot checkpoint" % " and ".join(
                VENDOR_NAMES.get(v, v) for v in unsupported)
        else:
            if runsc is None:
                runsc = runsc_info() or False
            if not runsc:
                continue  # no runsc here to ask: the step start decides
            help_text = runsc[2]
            reason = ("the installed runsc (%s, version %s) has no CUDA checkpoint support, so the GPUs' "
                      "state cannot be saved" % (runsc[0], runsc[1]))
        try:
            ckpt_policy.refuse_gpu_transparent(settings, vendors or {"nvidia"}, help_text)
        except ckpt_policy.CheckpointOptionError:
            name, value, where = request.gpus[0]
            why = "--sandbox-checkpoint=transparent" if settings.explicit else \
                "transparent checkpointing (the default of preemptible partition %s)" % partition
            return ("%s cannot save this job's GPUs: the job asks for GPUs (--%s=%s, from the %s) on "
                    "partition %s, and %s. Submit it with --sandbox-checkpoint=signal (your program gets "
                    "SIGUSR1 before preemption, saves its own state and is requeued) or "
                    "--sandbox-checkpoint=none (requeue only), or without GPUs."
                    % (why, name, value, where, partition, reason))
    return None


class _Arguments:
    pid, site_config, required_partitions = 0, "", ""

    def __init__(self):
        self.option = []


def _arguments(argv):
    """The shim's arguments (the module docstring's synopsis; argparse costs a few ms on every submission).
    Raises ValueError for anything else."""
    args = _Arguments()
    if len(argv) % 2:
        raise ValueError("arguments come in --name VALUE pairs: %r" % (argv,))
    for name, value in zip(argv[::2], argv[1::2]):
        if name == "--pid":
            args.pid = int(value)
        elif name in ("--site-config", "--required-partitions"):
            setattr(args, name[2:].replace("-", "_"), value)
        elif name == "--option":
            args.option.append(value)
        else:
            raise ValueError("unknown argument %s" % name)
    if args.pid <= 0:
        raise ValueError("--pid PID is required")
    return args


def main(argv=None):
    """Command line entry (see the module docstring). Returns the exit status: 0 submit, 1 refused."""
    command = "slurmbox"
    try:
        args = _arguments(sys.argv[1:] if argv is None else argv)
        sub_argv = process_argv(args.pid)
        env = process_environ(args.pid)
        command = process_command(args.pid, sub_argv)
        try:
            request = read_request(command, sub_argv, env, script_reader_for(args.pid, env))
        except Unsupported:
            return 0
        if not request.gpus or request.existing_job:
            return 0
        options = dict(item.partition("=")[::2] for item in args.option)
        site = load_site_policy(args.site_config)
        required = [p for p in args.required_partitions.split(",") if p]
        message = refusal(request, options, env, site, required, runsc_checkpoint_help,
                          lambda: default_partition(env))
    except Exception as err:  # never block a submission on our own failure
        sys.stderr.write("%s: warning: slurmbox could not check the job's checkpoint mode at submission (%s: "
                         "%s); its steps are still checked when they start\n" % (command, type(err).__name__, err))
        return 0
    if message:
        sys.stderr.write("%s: error: slurmbox: %s\n" % (command, message))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
