"""Root-run supervisor of one step's sandbox on one node.

Started by the SPANK shim (``python -I -m slurmbox.step.supervisor``) with
a clean environment and an already-listening Unix socket on fd 3. Each local
task's launcher connects, proves it runs as the job's user (SO_PEERCRED,
unix(7)), and hands over argv, environment, cwd and stdio descriptors. The
first request fixes the sandbox settings (options are validated against the
site policy); tasks then run as processes of one gVisor sandbox per node and
step: with one local task, the task is the container's init (``runsc run``);
with several, a holder init is started (``runsc create``/``start``) and each
task joins with ``runsc exec``. Signals from the launcher are delivered with
``runsc kill``; when the last local task ends the sandbox is deleted and the
step's runtime directory removed.

Checkpoints (slurmbox.migrate): a batch step whose checkpoint mode is
``transparent`` is saved with ``runsc checkpoint`` into the site's checkpoint
store when slurmctld preempts the job (SIGTERM with ``PreemptTime`` set) or a
root tool asks over ``control.sock`` (spot notice, maintenance), and the job
is requeued; when the requeued batch step starts, the newest valid checkpoint
is restored (``runsc restore``) instead of starting the script again. In
``signal`` mode the program gets its checkpoint signal instead and the job is
requeued once it exits. An ``srun`` step with one task per node is handled the
same way, each node's sandbox on its own (slurmbox.migrate.step_checkpoint).
"""

import argparse
import dataclasses
import json
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time

from slurmbox.sandbox import bundle, cleanup, devices, options, runsc, user_paths
from slurmbox.sandbox.framing import EXIT_SANDBOX_FAILED, recv_frame, send_frame
from slurmbox.sandbox.peer_signals import follow_peer
from slurmbox.sandbox.stdio_relay import StdioRelay
from slurmbox.migrate.outcomes import Outcome

#: Holder init for multi-task sandboxes: blocks reading its stdin, a pipe the
#: supervisor holds; when the supervisor closes it (or dies) the sandbox ends.
HOLDER_ARGV = ["/bin/sh", "-c", "read _unused || true"]
#: Where a batch step's script appears inside its sandbox (same on every node).
BATCH_SCRIPT_MOUNT = "/run/slurmbox-batch/slurm_script"
#: Slurm's status for a task whose command cannot be executed (slurmstepd exits 2 after execve fails).
EXIT_COMMAND_NOT_FOUND = 2


class StepFailure(RuntimeError):
    """The step cannot run in a sandbox; ``exit`` is the status the task reports."""

    def __init__(self, message, exit_code=EXIT_SANDBOX_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


def peer_uid(conn):
    """(pid, uid, gid) of the process at the other end of Unix socket ``conn``."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


def decode_status(returncode):
    """Map a runsc exit code to ``{"exit": N}`` or ``{"signal": N}``.

    runsc reports a process killed by signal N as exit code 128+N (as shells
    do); codes 129..192 are therefore read as signals. A program that itself
    exits with such a code is reported as killed by that signal (documented
    limitation of runsc's interface).
    """
    if returncode < 0:
        return {"signal": -returncode}
    if 128 < returncode <= 128 + 64:
        return {"signal": returncode - 128}
    return {"exit": returncode}


class Supervisor:
    """State of one step's sandbox on this node (see module docstring)."""

    def __init__(self, args):
        self.args = args
        self.cli_options = dict(o.split("=", 1) for o in args.option)
        self.node_dir = os.path.join(args.runtime_dir, args.node)
        self.state_root = os.path.join(self.node_dir, runsc.RUNSC_STATE_SUBDIR)
        self.container_id = cleanup.container_id_of(args.step_dir)
        self.bundle_dir = os.path.join(args.step_dir, "bundle")
        self.lock = threading.Lock()
        self.prepared = None        # (request, device plan, runsc prefix) or StepFailure
        self.holder = None          # subprocess of the holder init (multi-task)
        self.holder_input = None
        self.finished = 0
        self.brokers = []
        self.done = threading.Event()
        self.profile = None         # the step's site profile (compiled.Profile), set by _prepare
        self.recorded = False       # the sandbox record for `slurmbox sandbox` is written
        self.wall_timer = None      # enforces profile.wall_limit_s once the first task started
        self.policy = None
        self.task = None            # migrate.sandbox_task.CheckpointableTask of a batch step's init, if any
        self.checkpoint_step = args.step  # store step name: "batch", or "<step>.node<rank>" (migrate.step_checkpoint)
        self.step_manifest = {}     # manifest entries of an srun step's checkpoints (rank, command digest, ...)
        self.checkpoint_flags = []  # extra runsc checkpoint flags (CUDA state), set by _checkpoint_settings
        self.cuda_checkpoint_source = None  # the node's cuda-checkpoint bound into a GPU sandbox, if any
        self.accelerators = None    # devices.accelerators() of this step's allocation on this node
        self.gpu_models = []        # gres types of the GPUs Slurm allocated on this node (devices.job_gpu_types)
        self.staging = user_paths.Staging(args.step_dir)  # binds of the user's paths (user_paths.py)
        self.staging_lock = threading.Lock()
        self.mount_namespace_error = None  # set by main() when the private mount namespace is missing
        self.user_mounts = []       # the step's --sandbox-mounts as the user gave them (before staging)

    # -- preparation (once per step) -------------------------------------------------
    def prepare(self, task_env):
        """Validate options and devices from the first task; cache the outcome."""
        with self.lock:
            if self.prepared is None:
                try:
                    self.prepared = self._prepare(task_env)
                except (options.OptionError, devices.DeviceError, runsc.RunscError) as err:
                    self.prepared = StepFailure(str(err))
                except Exception as err:  # keep the message; never leave the task hanging
                    import traceback
                    traceback.print_exc()
                    self.prepared = StepFailure("internal error preparing the sandbox: %s" % err)
            if isinstance(self.prepared, StepFailure):
                raise self.prepared
            return self.prepared

    def _prepare(self, task_env):
        from slurmbox.settings.compiled import load_policy

        policy = load_policy(self.args.site_config, self.node_dir)
        self.policy = policy
        merged = options.merge_sources(self.cli_options, task_env)
        request = options.resolve(merged, policy, self.args.partition, self.args.partition_requires_sandbox,
                                  self.args.runtime_dir)
        uid, gid = self.args.uid, self.args.gid
        _, _, groups = bundle.user_identity(uid, gid)
        if self.mount_namespace_error and (request.image or request.mounts):
            raise StepFailure("the supervisor has no private mount namespace (%s), so it cannot bind your paths "
                              "safely; ask the admin to check this node" % self.mount_namespace_error)
        profile = policy.profiles[request.profile]
        if request.image:
            staged = self._stage_image(request.image, groups, request.dry_run, profile)
            request = dataclasses.replace(request, image_bind=staged)
        if request.mounts:
            self.user_mounts = list(request.mounts)
            request = dataclasses.replace(request, mounts=self._stage_mounts(request, groups, profile))
        self.profile = profile
        runsc_path = runsc.find_runsc()
        caps = runsc.capabilities(runsc_path, self.node_dir)
        plan = devices.plan_devices(self._allocated_device_files(task_env), set(caps["flags"]),
                                    profile.allow_unproxied_devices, strict=not request.dry_run)
        platform = runsc.choose_platform(profile.platform, caps)
        prefix = runsc.global_args(runsc_path, self.state_root, platform, request.network,
                                   list(profile.runsc_flags) + plan.runsc_flags)
        return request, plan, prefix, groups

    def _user_gids(self, groups):
        return [self.args.gid] + [g for g in groups if g != self.args.gid]

    def _opened_source_problem(self, fd, profile):
        """Why the inode behind ``fd`` (opened as the user) may not be bound, or None: judged on the
        descriptor (its file system type and the kernel's path of it), never on the name given."""
        pseudo = user_paths.pseudo_filesystem(fd)
        if pseudo:
            return "it is on the kernel's %s file system, which cannot be mounted into a sandbox" % pseudo
        return options.source_problem(user_paths.opened_path(fd), profile, self.args.runtime_dir)

    def _stage_image(self, image, groups, dry_run, profile):
        """The user's image directory, opened as the user and bound into the staging directory
        (its path; ``image`` itself for a dry run, which starts nothing)."""
        try:
            fd, info = user_paths.open_source(image, self.args.uid, self._user_gids(groups), write=False)
        except user_paths.UserPathError as err:
            raise options.OptionError("image", image, str(err))
        try:
            problem = self._opened_source_problem(fd, None)
            if problem:
                raise options.OptionError("image", image, problem)
            if not stat.S_ISDIR(info.st_mode):
                raise options.OptionError("image", image, "the image must be a directory (the root file system)")
            if dry_run:
                return image
            with self.staging_lock:
                return self.staging.stage(fd, read_only=True)
        finally:
            os.close(fd)

    def _stage_mounts(self, request, groups, profile):
        """request.mounts with each source opened as the user, checked on its descriptor, and
        replaced by its staging bind (list of options.Mount). Raises options.OptionError."""
        device_inodes = self._device_directory_inodes()
        staged = []
        for mount in request.mounts:
            name = "%s:%s" % (mount.source, mount.destination)
            try:
                fd, info = user_paths.open_source(mount.source, self.args.uid, self._user_gids(groups),
                                                  write=not mount.read_only)
            except user_paths.UserPathError as err:
                raise options.OptionError("mounts", name, str(err))
            try:
                problem = self._opened_source_problem(fd, profile)
                if problem:
                    raise options.OptionError("mounts", name, problem)
                if (info.st_dev, info.st_ino) in device_inodes:
                    raise options.OptionError("mounts", name, "the source holds this node's accelerator device files "
                                              "(gres.conf); devices come only from the step's allocation")
                problem = self._mount_point_problem(request, mount.destination, stat.S_ISDIR(info.st_mode), groups)
                if problem:
                    raise options.OptionError("mounts", name, problem)
                if request.dry_run:
                    source = mount.source
                else:
                    with self.staging_lock:
                        source = self.staging.stage(fd, mount.read_only)
            finally:
                os.close(fd)
            staged.append(options.Mount(source=source, destination=mount.destination, read_only=mount.read_only))
        return staged

    def _mount_point_problem(self, request, destination, source_is_dir, groups):
        """bundle.mount_point_problem for this step's root: the node's root (and a dry run's
        unstaged image) is looked at as the user, since root's answer would say what exists where
        the user cannot look; a staged image, whose root the user cannot rename, as root without
        following any symlink."""
        if request.image_bind and not request.dry_run:
            return bundle.mount_point_problem(request.image_bind, destination, source_is_dir)
        # A dry run stages nothing: its image is still the user's path, which the user can swap.
        root = request.image_bind or "/"
        return user_paths.as_user(lambda: bundle.mount_point_problem(root, destination, source_is_dir),
                                  self.args.uid, self._user_gids(groups))

    def _workdir_problem(self, workdir, request, task_cwd, groups):
        """Why ``--sandbox-workdir`` names no directory inside this sandbox, or None, without ever
        asking the node as root: /tmp and /dev/shm are the sandbox's own; under a bind (a mount
        destination or the working directory) the user's source is looked at as the user; under
        a directory the sandbox hides, nothing exists; elsewhere on the node's root, as the user."""
        def under(path, top):
            return path == top or path.startswith(top.rstrip("/") + "/")

        if under(workdir, "/tmp") or under(workdir, "/dev/shm"):
            return None
        binds = [(m.destination, m.source) for m in self.user_mounts]
        if task_cwd != "/":
            binds.append((task_cwd, task_cwd))
        covering = [b for b in binds if under(workdir, b[0])]
        gids = self._user_gids(groups)
        if covering:
            destination, source = max(covering, key=lambda b: len(b[0]))
            host = source + workdir[len(destination.rstrip("/")):]
            found = user_paths.enterable_as_user(host, self.args.uid, gids)
        elif request.image:
            return None  # inside the user's own image: runsc resolves it there
        elif any(under(workdir, d) for d in bundle.MASKED_HOST_DIRS):
            found = workdir in bundle.MASKED_HOST_DIRS  # hidden: an empty directory inside
        else:
            found = user_paths.enterable_as_user(workdir, self.args.uid, gids)
        if found:
            return None
        return ("%s is not a directory inside the sandbox; use /tmp, a mount destination or the working "
                "directory" % workdir)

    def _device_directory_inodes(self):
        """(st_dev, st_ino) of each directory holding this node's gres.conf device files and of
        every directory above it: a mount of one would hand the sandbox every GPU of the node."""
        inodes = set()
        for directory in self._device_directories():
            while True:
                try:
                    info = os.stat(directory)
                    inodes.add((info.st_dev, info.st_ino))
                except OSError:
                    pass
                if directory == "/":
                    break
                directory = os.path.dirname(directory)
        return inodes

    def _allocated_device_files(self, task_env):
        """Host device files of the GPUs this step may use on this node.

        The job's GPUs on this node come from slurmctld as structured data
        (slurm_client.job_facts: ``squeue --json``), never from text a job
        name could imitate. The step's share is ``SLURM_STEP_GPUS``, trusted
        because slurmstepd overwrites it for a step with GPU gres and removes it
        for one without (a user-set value never survives); ``SLURM_JOB_GPUS``
        keeps a user-set value in srun steps and is ignored. A claim outside
        the job's allocation on this node is refused.
        """
        from slurmbox.slurm_client import job_facts

        claimed = task_env.get("SLURM_STEP_GPUS")
        if not claimed:
            return []
        try:
            claimed_indices = devices.parse_index_list(claimed)
        except ValueError:
            raise devices.DeviceError("SLURM_STEP_GPUS=%r is not an index list" % claimed)
        try:
            facts = job_facts.read_job_facts(self.args.job, env=self._slurm_env())
        except job_facts.SlurmCommandError as err:
            raise devices.DeviceError("cannot read the GPU allocation of job %s from slurmctld: %s"
                                      % (self.args.job, err))
        if facts.user_id != self.args.uid:
            raise devices.DeviceError("slurmctld records job %s for uid %d, not this step's uid %d"
                                      % (self.args.job, facts.user_id, self.args.uid))
        granted, self.gpu_models = job_facts.gpu_allocation(facts, self.args.node)
        granted_set = set(granted)
        refused = [i for i in claimed_indices if i not in granted_set]
        if refused:
            raise devices.DeviceError("GPU indices %s are not allocated to job %s on %s"
                                      % (refused, self.args.job, self.args.node))
        gres_path = os.path.join(os.path.dirname(self.args.slurm_conf), "gres.conf")
        with open(gres_path) as handle:
            files = devices.gres_gpu_files(handle.read(), self.args.node)
        try:
            return [files[i] for i in claimed_indices]
        except IndexError:
            raise devices.DeviceError("gres.conf at %s lists %d GPU files for %s, fewer than index %d"
                                      % (gres_path, len(files), self.args.node, max(claimed_indices)))

    def _device_directories(self):
        """Real paths of the directories holding this node's gres.conf device files (set of str); a mount
        of one of them, or of a directory above one, would hand the sandbox every GPU of the node."""
        try:
            with open(os.path.join(os.path.dirname(self.args.slurm_conf), "gres.conf")) as handle:
                files = devices.gres_gpu_files(handle.read(), self.args.node)
        except OSError:
            return set()
        return {os.path.realpath(os.path.dirname(f)) for f in files}

    def _slurm_env(self):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if self.args.slurm_conf:
            env["SLURM_CONF"] = self.args.slurm_conf
        return env

    # -- per task ------------------------------------------------------------------
    def handle(self, conn):
        """Serve one launcher connection until its task ends."""
        fds, accepted = [], False
        try:
            peer_pid, peer, _gid = peer_uid(conn)
            if peer != self.args.uid:
                send_frame(conn, {"error": "this sandbox belongs to job %s of another user" % self.args.job})
                return
            message, fds = recv_frame(conn)
            if not isinstance(message, dict) or len(fds) != 3 or not message.get("argv"):
                return
            accepted = True
            try:
                self.run_task(conn, message, fds, peer_pid)
            except StepFailure as failure:
                send_frame(conn, {"error": str(failure), "exit": failure.exit_code})
        except (OSError, ValueError):
            import traceback
            traceback.print_exc()
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()
            if accepted:  # only a task's own launcher counts towards the step's end
                with self.lock:
                    self.finished += 1
                    if self.finished >= self.args.local_tasks:
                        self.done.set()

    def run_task(self, conn, message, fds, peer_pid):
        """Start the task inside the sandbox, forward signals, report its status.

        ``peer_pid``: the launcher's pid (SO_PEERCRED); its working directory
        and rlimits are read from the kernel, not from the message.
        """
        request, plan, prefix, groups = self.prepare(message["env"])
        self.accelerators = devices.accelerators(plan, self.gpu_models)  # in checkpoints; restores must match
        env = {str(k): str(v) for k, v in dict(message["env"]).items()}
        env.update(plan.env)
        from slurmbox.topology import sandbox_hints  # this node's NCCL topology file, if the site has one
        topo_mounts, topo_env = sandbox_hints.for_step(self.args.site_config, self.args.node, env, request)
        env.update(topo_env)
        root = request.image_bind or "/"
        task_cwd = self._peer_cwd(peer_pid, groups)
        cwd = request.workdir or task_cwd
        if request.workdir:
            problem = self._workdir_problem(request.workdir, request, task_cwd, groups)
            if problem:
                raise StepFailure(str(options.OptionError("workdir", request.workdir, problem)))
        try:
            argv = list(message["argv"])
            # As the user: root's answer would tell whether a file exists in a directory they cannot read.
            argv[0] = user_paths.as_user(lambda: bundle.resolve_command(argv[0], env.get("PATH"), root, cwd),
                                         self.args.uid, self._user_gids(groups))
        except bundle.CommandNotFound as missing:
            # Same status and wording as slurmstepd's own failed execve() (exit 2).
            os.write(fds[2], ("slurmbox: error: execve(): %s: No such file or directory (inside the sandbox)\n"
                              % missing).encode())
            send_frame(conn, {"exit": EXIT_COMMAND_NOT_FOUND})
            return
        process = bundle.process_spec(argv, env, cwd, self.args.uid, self.args.gid, groups,
                                      message.get("tty"), bundle.process_rlimits(peer_pid))
        bind_dirs = [self._stage_cwd(task_cwd, groups, request.dry_run, request)] if task_cwd != "/" else []
        extra_mounts = list(topo_mounts)
        if self.args.step == "batch" and not request.dry_run:
            batch_mounts, prefix = self._batch_step_access(prefix, process, request, groups, fds, task_cwd)
            extra_mounts += batch_mounts
        spec = bundle.build_spec(process, request, self.args.node, bind_dirs, plan.devices, extra_mounts)
        bundle.apply_profile_limits(spec, self.profile)
        problem = bundle.apply_step_cgroup(spec, self.args.job, self.args.step, self.args.node, self.args.runtime_dir,
                                           create=not request.dry_run)
        if problem:
            self.say(None, problem)
        if request.dry_run:
            for problem in plan.problems:
                os.write(fds[2], ("slurmbox: warning: this step would fail: %s\n" % problem).encode())
            os.write(fds[1], (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode())
            send_frame(conn, {"exit": 0})
            return
        self._record_once(request, plan, spec, prefix)
        settings = self._checkpoint_settings(message["env"], plan, prefix, message["argv"],
                                             bool(spec["process"]["terminal"]), request.image,
                                             [m.destination for m in request.mounts], spec["process"]["env"])
        if self.cuda_checkpoint_source:  # runsc runs it inside the sandbox to save and restore CUDA state
            from slurmbox.migrate.policy import CUDA_CHECKPOINT_MOUNT
            spec["mounts"].append({"destination": CUDA_CHECKPOINT_MOUNT, "type": "bind",
                                   "source": self.cuda_checkpoint_source, "options": ["rbind", "ro"]})
        restore = None
        if settings.mode == "transparent" and (self.args.step == "batch" or self.step_manifest.get("restart_count")):
            restore = self._choose_restore(spec, fds[2], settings)  # an srun step of a first run has none
        relay = StdioRelay(fds, spec["process"]["terminal"])
        task = kept_fds = None
        try:
            if self.args.local_tasks == 1:
                if settings.mode != "none":  # keep the sandbox's side of stdio for a later restore here
                    kept_fds = [os.dup(fd) for fd in relay.child_fds]
                if restore is not None:
                    proc, kill_args = self._restore_as_init(restore[0], restore[1], prefix, relay.child_fds)
                    spec = restore[1]
                else:
                    proc, kill_args = self._run_as_init(spec, prefix, relay.child_fds)
            else:
                proc, kill_args = self._exec_in_sandbox(spec, prefix, relay.child_fds)
        finally:
            relay.started()
        if kept_fds is not None:  # imported while runsc starts, off the step's start path
            from slurmbox.migrate.sandbox_task import CheckpointableTask
            task = CheckpointableTask(self, settings, prefix, spec, kept_fds, fds[2])
            task.spec, task.proc = spec, proc
            task.checkpoint_flags = list(self.checkpoint_flags)
            self.task = task
            if self.args.step == "batch":  # an srun step's tasks get SIGTERM when the grace time starts
                task.start_preemption_watch(self.args.partition)
            task.start_periodic()
        self._start_wall_limit(prefix, fds[2])
        self._relay(conn, proc, prefix, kill_args, relay, task)

    def _start_wall_limit(self, prefix, stderr_fd):
        """Kill the whole sandbox once the profile's ``wall_limit_s`` has passed (first task starts it)."""
        limit = getattr(self.profile, "wall_limit_s", 0)
        with self.lock:
            if not limit or self.wall_timer is not None:
                return
            stderr_fd = os.dup(stderr_fd)  # the task's own fd closes when its launcher's connection ends
            message = ("slurmbox: error: the sandbox profile's wall limit of %d s was reached; killing the step's "
                       "sandbox\n" % limit).encode()

            def expire():
                try:
                    os.write(stderr_fd, message)
                except OSError:
                    pass
                print(message.decode().strip(), file=sys.stderr)  # the step's slurmbox log
                runsc.kill(prefix, self.container_id, "KILL", all_processes=True)

            self.wall_timer = threading.Timer(limit, expire)
            self.wall_timer.daemon = True
            self.wall_timer.start()

    def _record_once(self, request, plan, spec, prefix):
        """Write the sandbox's record for `slurmbox sandbox ls/inspect` (first task only)."""
        with self.lock:
            if self.recorded:
                return
            self.recorded = True
        from slurmbox.sandbox import registry
        try:
            registry.write_record(self.args.step_dir, registry.build_record(self.args, request, plan, spec, prefix),
                                  self.args.uid)
        except OSError as err:  # listing is a convenience: never fail the step for it
            print("slurmbox: cannot write the sandbox record: %s" % err, file=sys.stderr)

    def _peer_cwd(self, peer_pid, groups):
        """The launcher's working directory as the kernel resolved it (never the message's word)."""
        try:
            return os.readlink("/proc/%d/cwd" % peer_pid)
        except OSError:
            raise StepFailure("cannot read the task's working directory")

    def _stage_cwd(self, task_cwd, groups, dry_run, request):
        """The task's working directory as an options.Mount at its own path, its source opened
        as the user and bound into the staging directory (read-only when the user cannot write it)."""
        try:
            fd, info = user_paths.open_source(task_cwd, self.args.uid, self._user_gids(groups), write=False)
        except user_paths.UserPathError as err:
            raise StepFailure("cannot use the working directory: %s" % err)
        try:
            problem = self._opened_source_problem(fd, None)
            if not problem and not request.image:
                # The bind lands at the directory's own path: runsc's gofer would re-create it on the
                # node, as root, if it was removed meanwhile (e.g. before a requeued job restarts).
                problem = self._mount_point_problem(request, task_cwd, True, groups)
            if problem:
                raise StepFailure("cannot use the working directory %s: %s" % (task_cwd, problem))
            if not stat.S_ISDIR(info.st_mode):
                raise StepFailure("the working directory %s is not a directory" % task_cwd)
            read_only = not user_paths.write_allowed(info, self.args.uid, self._user_gids(groups))
            if dry_run:
                return options.Mount(source=task_cwd, destination=task_cwd, read_only=read_only)
            with self.staging_lock:
                source = self.staging.stage(fd, read_only)
        finally:
            os.close(fd)
        return options.Mount(source=source, destination=task_cwd, read_only=read_only)

    def _batch_step_access(self, prefix, process, request, groups, fds, task_cwd):
        """Mounts, runsc flags and environment of a sandboxed batch step.

        The batch script lives in slurmd's spool directory (bound read-only).
        ``srun`` inside is the launcher in proxy mode, bound over the node's
        srun, talking to a StepBroker through sockets it may create in the
        broker directory (``--host-uds=create``; connecting to host sockets
        stays forbidden). Returns (mounts, runsc prefix).
        """
        from slurmbox.step.step_broker import BROKER_MOUNT, StepBroker

        script = self.args.batch_script  # from slurmstepd via the shim, not from the launcher
        if not script or not os.path.isfile(script):
            raise StepFailure("the batch script of job %s was not found on this node" % self.args.job)
        requires = self.args.partition_requires_sandbox or self.policy.partition(self.args.partition).sandbox == "required"
        broker = StepBroker.create(self.args.step_dir, self.args.uid, self.args.gid, groups, fds, task_cwd,
                                   self.args.slurm_conf, self.args.job, requires)
        broker.start()
        self.brokers.append(broker)
        install_root = os.path.dirname(sys.prefix)  # <prefix>/venv -> <prefix>: launcher and its python
        # The script is bound at a fixed path, not at its spool path: a checkpoint restored on another
        # node must find it where the sandbox had it, and runsc creates missing mount points on the host.
        inside = script
        if process["args"] and os.path.realpath(process["args"][0]) == os.path.realpath(script):
            process["args"][0] = inside = BATCH_SCRIPT_MOUNT
        mounts = [options.Mount(script, inside, True), options.Mount(install_root, install_root, True),
                  options.Mount(broker.directory, BROKER_MOUNT, False),
                  options.Mount(self.args.launcher, broker.srun, True)]  # srun's proxy over the node's srun
        process["env"] = [e for e in process["env"] if not e.startswith(("SLURMBOX_STEP_BROKER=", "SLURMBOX_SANDBOX="))]
        process["env"] += ["SLURMBOX_STEP_BROKER=%s" % BROKER_MOUNT, "SLURMBOX_SANDBOX=%s" % request.profile]
        return mounts, prefix + ["--host-uds=create"]

    def _write_json(self, path, data):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            json.dump(data, handle)

    def _run_as_init(self, spec, prefix, fds):
        self._write_json(os.path.join(self.bundle_dir, "config.json"), spec)
        proc = runsc.spawn(prefix + ["run", "--bundle", self.bundle_dir, self.container_id],
                           stdin=fds[0], stdout=fds[1], stderr=fds[2], close_fds=True, start_new_session=True)
        return proc, [self.container_id]

    def _ensure_holder(self, spec, prefix):
        with self.lock:
            if self.holder is not None:
                return
            holder_spec = dict(spec)
            holder_spec["process"] = dict(spec["process"], args=HOLDER_ARGV, terminal=False)
            self._write_json(os.path.join(self.bundle_dir, "config.json"), holder_spec)
            read_end, write_end = os.pipe()
            log = open(os.path.join(self.args.step_dir, "holder.log"), "wb")
            create = runsc.spawn(prefix + ["create", "--bundle", self.bundle_dir, self.container_id],
                                 stdin=read_end, stdout=log, stderr=log, close_fds=True)
            create.wait()
            os.close(read_end)
            log.close()
            if create.returncode != 0:
                os.close(write_end)
                raise StepFailure("runsc create failed (exit %d); see %s" % (create.returncode, self.args.step_dir))
            started = runsc.call(prefix + ["start", self.container_id])
            if started.returncode != 0:
                os.close(write_end)
                raise StepFailure("runsc start failed: %s" % started.stderr.strip())
            self.holder, self.holder_input = True, write_end

    def _exec_in_sandbox(self, spec, prefix, fds):
        self._ensure_holder(spec, prefix)
        task_dir = os.path.join(self.args.step_dir, "tasks", str(fds[0]) + "-" + str(threading.get_ident()))
        process_json = os.path.join(task_dir, "process.json")
        self._write_json(process_json, spec["process"])
        pid_file = os.path.join(task_dir, "pid")
        proc = runsc.spawn(prefix + ["exec", "--process", process_json, "--internal-pid-file", pid_file,
                                     self.container_id],
                           stdin=fds[0], stdout=fds[1], stderr=fds[2], close_fds=True, start_new_session=True)
        return proc, pid_file

    def _restore_as_init(self, ckpt, spec, prefix, fds):
        from slurmbox.migrate.runsc_checkpoint import restore_argv, restore_flags

        bundle.apply_step_cgroup(spec, self.args.job, self.args.step, self.args.node, self.args.runtime_dir)  # ours
        self._write_json(os.path.join(self.bundle_dir, "config.json"), spec)
        flags = restore_flags(self._runsc_features(), ckpt.manifest)
        proc = runsc.spawn(restore_argv(prefix, ckpt.path, self.bundle_dir, self.container_id, flags),
                           stdin=fds[0], stdout=fds[1], stderr=fds[2], close_fds=True, start_new_session=True)
        return proc, [self.container_id]

    # -- checkpoints (batch steps; slurmbox.migrate) -------------------------------------
    def _checkpoint_settings(self, task_env, plan, prefix, argv=(), terminal=False, image=None, mounts=(),
                             environment=()):
        """CheckpointSettings of this step: a batch step's init, or an srun step with one task per node
        (slurmbox.migrate.step_checkpoint, which sets ``checkpoint_step`` and ``step_manifest``).
        ``image``: the ``--sandbox-image`` (None: the node's root); ``mounts``: the user's bind mount
        destinations; ``environment``: the spec's process environment ("NAME=value"). For a GPU sandbox
        saved with runsc's CUDA checkpoint, sets ``checkpoint_flags`` and ``cuda_checkpoint_source`` (the
        node's cuda-checkpoint, to bind into the sandbox; policy.cuda_checkpoint_blockers)."""
        from slurmbox.migrate import policy as ckpt_policy

        self.checkpoint_flags = []
        self.cuda_checkpoint_source = None
        if self.args.step == "batch" and self.args.local_tasks != 1:
            return ckpt_policy.CheckpointSettings()
        try:
            settings = ckpt_policy.resolve(self.cli_options, task_env, self.policy.partition(self.args.partition))
            if self.args.step != "batch":
                from slurmbox.migrate.step_checkpoint import srun_step_settings
                settings, self.checkpoint_step, self.step_manifest, note = srun_step_settings(
                    settings, self.args.step, self.args.local_tasks, task_env, argv, terminal)
                if note:
                    self.say(None, note)
            if settings.mode == "transparent" and plan.vendor:
                from slurmbox.migrate.runsc_checkpoint import CheckpointError, checkpoint_features
                try:
                    flags = checkpoint_features(prefix[0], self.node_dir)["flags"]
                except CheckpointError as err:
                    raise StepFailure(str(err))
                problem = host_binary = None
                if plan.vendor == "nvidia" and ckpt_policy.gpu_checkpoint_flag(flags):
                    configured = getattr(getattr(self.policy, "checkpoint_store", None), "cuda_checkpoint", None)
                    host_binary, problem = ckpt_policy.find_cuda_checkpoint(configured)
                    allowed = bool(getattr(getattr(self.policy, "checkpoint_store", None), "allow_cuda_checkpoint",
                                           False))
                    blockers = ckpt_policy.cuda_checkpoint_blockers(image, mounts, environment, allowed)
                    problem = "; ".join(([problem] if problem else []) + blockers) or None
                settings = ckpt_policy.refuse_gpu_transparent(settings, {plan.vendor}, flags, problem)
                if settings.mode == "transparent":
                    self.checkpoint_flags = ckpt_policy.cuda_checkpoint_flags(flags)
                    self.cuda_checkpoint_source = host_binary
        except ckpt_policy.CheckpointOptionError as err:
            raise StepFailure(str(err))
        return settings

    def store(self):
        """The site's CheckpointStore (slurmbox.migrate.store)."""
        from slurmbox.migrate.store import store_from_policy

        return store_from_policy(self.policy)

    def say(self, fd, text):
        """Tell the job (its stderr ``fd``, may be None) and the slurmbox log (our stderr) ``text``."""
        line = "slurmbox: %s\n" % text
        if fd is not None:
            try:
                os.write(fd, line.encode())
            except OSError:
                pass
        sys.stderr.write("%s job %s step %s: %s" % (time.strftime("%Y-%m-%dT%H:%M:%S"), self.args.job,
                                                    self.args.step, line[len("slurmbox: "):]))
        sys.stderr.flush()

    def batch_script_sha256(self):
        """sha256 (hex) of this batch step's script, or None (not a batch step, unreadable)."""
        from slurmbox.migrate.store import file_sha256

        try:
            return file_sha256(self.args.batch_script)[1] if self.args.batch_script else None
        except OSError:
            return None

    def _runsc_features(self):
        """checkpoint_features (dict) of this node's runsc, or None when it cannot be read."""
        from slurmbox.migrate.runsc_checkpoint import checkpoint_features
        from slurmbox.migrate.store import CheckpointError
        try:
            return checkpoint_features(runsc.find_runsc(), self.node_dir)
        except (OSError, CheckpointError, RuntimeError):
            return None

    def _choose_restore(self, spec, err_fd, settings):
        """(Checkpoint, restore spec) to restore from, or None to start the program.

        Raises StepFailure when checkpoints existed, none is usable and the
        site's restore_fallback is "fail".
        """
        from slurmbox.migrate.restore import restore_spec, select_checkpoint
        from slurmbox.migrate.store import CheckpointError

        try:
            store = self.store()
            selection = select_checkpoint(store, self.args.job, self.checkpoint_step, self.args.uid,
                                          self.batch_script_sha256(), self.step_manifest.get("command_sha256"),
                                          self._runsc_features(), self.accelerators)
            for line in selection.messages():
                self.say(err_fd, line)
            if selection.checkpoint is not None:
                return selection.checkpoint, restore_spec(selection.checkpoint, spec, self.args.batch_script)
            if not selection.skipped:
                return None
            problem = "no valid checkpoint of job %s is left" % self.args.job
        except (OSError, CheckpointError) as err:
            problem = "cannot restore job %s: %s" % (self.args.job, err)
        if settings.restore_fallback == "fail":
            raise StepFailure("%s and the partition's restore_fallback is 'fail'; the job ends here (resubmit it "
                              "to start from the beginning)" % problem)
        self.say(err_fd, "%s; starting the program from the beginning (restore_fallback=fresh)" % problem)
        return None

    def evacuate(self, reason):
        """Checkpoint (or signal) this step's sandbox and requeue the job; for ``control.sock`` requests.

        Returns ``{"outcome": ..., "message": ..., "checkpoint": path}`` (see slurmbox.migrate.triggers).
        """
        task = self.task
        if task is None:
            return {"outcome": Outcome.UNSUPPORTED, "message": "step %s of job %s is not checkpointed (checkpoint mode "
                    "none, several tasks per node, or not started)" % (self.args.step, self.args.job)}
        return task.evacuate(reason, wait=True)

    def _kill(self, prefix, kill_args, signum):
        if isinstance(kill_args, str):  # exec'd task: signal its in-sandbox pid
            try:
                with open(kill_args) as handle:
                    pid = handle.read().strip()
            except OSError:
                return
            runsc.kill(prefix, self.container_id, signum, pid=pid)
        else:
            runsc.kill(prefix, self.container_id, signum)

    def _relay(self, conn, proc, prefix, kill_args, relay, task=None):
        finished = threading.Event()

        def on_signal(signum):
            if signum == signal.SIGWINCH:
                relay.resize()  # the inner pty signals its foreground group itself
            elif task is None or not task.on_signal(signum):
                self._kill(prefix, kill_args, signum)

        def on_gone():
            if task is not None:
                task.gone = True
            self._kill(prefix, kill_args, signal.SIGKILL)

        # A launcher that disappears was killed (SIGKILL): the task must not outlive it.
        follow_peer(conn, finished, on_signal, on_gone)
        while True:
            returncode = proc.wait()
            outcome = task.after_exit() if task is not None else None
            if outcome == Outcome.RESUMED:  # checkpointed but not requeued: running here again
                proc = task.proc
                continue
            break
        if outcome == Outcome.REQUEUED and self.args.step != "batch":
            from slurmbox.migrate.step_checkpoint import hold_until_ended
            hold_until_ended(task)  # srun must not return to the batch script before the requeue ends it
        finished.set()
        if task is not None:
            task.close()
        relay.finish()
        if outcome == Outcome.REQUEUED:
            status = {"signal": int(signal.SIGTERM)}  # Slurm requeues the job; the batch step ends as if killed
        elif outcome == Outcome.LOST:
            status = {"exit": EXIT_SANDBOX_FAILED}
        elif outcome == Outcome.INTERRUPTED:  # Slurm ended the step during a periodic checkpoint
            status = {"signal": int(task.evacuation.interrupted or signal.SIGKILL)}
        else:
            status = decode_status(returncode)
            if task is not None and "exit" in status:
                task.forget_checkpoints()  # the program exited on its own: its checkpoints are history
        try:
            send_frame(conn, status)
        except OSError:
            pass

    # -- lifetime --------------------------------------------------------------------
    def serve(self, listener):
        """Accept launchers until every local task has ended, then tear down."""
        self._start_control()

        def accept_loop():
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

        threading.Thread(target=accept_loop, daemon=True).start()
        self.done.wait()
        self.teardown()

    def _start_control(self):
        """Listen on ``control.sock`` (root only) for checkpoint requests (slurmbox.migrate.triggers)."""
        from slurmbox.migrate.triggers import CONTROL_SOCKET

        path = os.path.join(self.args.step_dir, CONTROL_SOCKET)
        try:
            if os.path.lexists(path):
                os.unlink(path)
            control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            control.bind(path)  # umask 077: root only
            control.listen(8)
        except OSError as err:
            self.say(None, "no control socket (%s): spot-watch and migrate cannot checkpoint this step" % err)
            return

        def serve_one(conn):
            try:
                if peer_uid(conn)[1] != 0:
                    return
                request, fds = recv_frame(conn)
                for fd in fds:
                    os.close(fd)
                if isinstance(request, dict) and request.get("action") == "checkpoint":
                    try:
                        answer = self.evacuate(str(request.get("reason") or "requested"))
                    except Exception as err:  # answer the tool; the traceback goes to the slurmbox log
                        import traceback
                        traceback.print_exc()
                        answer = {"outcome": Outcome.FAILED, "message": "internal error: %s" % err}
                    send_frame(conn, answer)
                else:
                    send_frame(conn, {"outcome": Outcome.FAILED, "message": "unknown request"})
            except (OSError, ValueError):
                pass
            finally:
                conn.close()

        def accept_loop():
            while True:
                try:
                    conn, _ = control.accept()
                except OSError:
                    return
                threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

        threading.Thread(target=accept_loop, daemon=True).start()

    def teardown(self):
        """Delete the sandbox and the step's bundle; idempotent."""
        if self.wall_timer is not None:
            self.wall_timer.cancel()
        for broker in self.brokers:
            broker.stop()
        if self.holder_input is not None:
            os.close(self.holder_input)
            self.holder_input = None
        from slurmbox.sandbox.cleanup import remove_step
        remove_step(self.args.step_dir, self.args.runtime_dir)


def parse_args(argv):
    """Command line given by the SPANK shim (see spank_plugin/slurmbox_spank.c)."""
    parser = argparse.ArgumentParser(prog="slurmbox-supervisor")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--step-dir", required=True)
    parser.add_argument("--runtime-dir", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--step", required=True)
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--gid", type=int, required=True)
    parser.add_argument("--local-tasks", type=int, required=True)
    parser.add_argument("--partition", default="")
    parser.add_argument("--site-config", default="")
    parser.add_argument("--slurm-conf", default="/etc/slurm/slurm.conf")
    parser.add_argument("--partition-requires-sandbox", action="store_true")
    parser.add_argument("--launcher", default="/opt/slurmbox/libexec/slurmbox-launch")
    parser.add_argument("--batch-script", default="")
    parser.add_argument("--option", action="append", default=[])
    return parser.parse_args(argv)


def main(argv=None):
    """Entry point used by the SPANK shim."""
    os.umask(0o077)  # bundles hold the task's environment: root only
    args = parse_args(sys.argv[1:] if argv is None else argv)
    namespace_error = None
    try:  # first, while single-threaded: the binds of the user's paths stay in here (user_paths.py)
        user_paths.enter_private_mount_namespace()
    except OSError as err:
        namespace_error = str(err)
    listener = socket.socket(fileno=args.listen_fd)
    supervisor = Supervisor(args)
    supervisor.mount_namespace_error = namespace_error
    if namespace_error:
        supervisor.say(None, "no private mount namespace: %s" % namespace_error)
    signal.signal(signal.SIGTERM, lambda *_: supervisor.done.set())
    supervisor.serve(listener)


if __name__ == "__main__":
    main()
