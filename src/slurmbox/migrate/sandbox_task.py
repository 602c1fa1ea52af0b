"""The supervisor's side of checkpointing one running sandbox (a batch step's init).

A CheckpointableTask follows one ``runsc run``/``runsc restore`` process of a
step supervisor (slurmbox.step.supervisor) and performs an *evacuation*
when asked: by SIGTERM from a Slurm preemption (checked with slurmctld's
``PreemptTime``), or by a root tool over the step's control socket (spot
notice, maintenance), or, for a rank of a multi-node srun step, by SIGTERM
with a request from the rank whose node is being evacuated
(slurmbox.migrate.step_checkpoint.request_peers). An evacuation is, in ``transparent`` mode: runsc
checkpoint into the store (this stops the sandbox), publish, ``scontrol
requeue``; in ``signal`` mode: send the program its checkpoint signal, wait
for it to exit, ``scontrol requeue``. If the requeue is refused after a good
checkpoint, the sandbox is restored here and keeps running. Every step of it
is reported in the job's stderr and the slurmbox log.

Standard library only; imported by the supervisor only for steps with a
checkpoint mode other than ``none``.
"""

import os
import signal
import threading
import time

from slurmbox.migrate import triggers
from slurmbox.migrate.runsc_checkpoint import (CheckpointFailed, checkpoint_sandbox, restore_argv, restore_flags,
                                               runsc_description)
from slurmbox.migrate.step_checkpoint import PEER_SIGNAL_WAIT_S, before_requeue, request_peers, take_peer_request
from slurmbox.migrate.store import CheckpointError
from slurmbox.sandbox import runsc
from slurmbox.slurm_client import scontrol
from slurmbox.migrate.outcomes import Outcome

#: Seconds a control-socket request waits for a signal-mode program to exit
#: before the job is requeued anyway (Slurm then kills what is left).
SIGNAL_DEADLINE_S = 60.0
#: Seconds a control-socket request waits for a transparent evacuation.
EVACUATION_TIMEOUT_S = 600.0
#: Seconds a local restore (after a periodic checkpoint, or a refused requeue) is waited for before the
#: evacuation ends; signals that come meanwhile are handled once it runs.
RESUME_WAIT_S = 60.0


class Evacuation:
    """One checkpoint-and-requeue in progress: ``reason``; ``outcome`` once ``decided`` is set:
    "requeued", "resumed" (checkpointed, not requeued, running here again), "lost" (the
    program is gone and the job could not be requeued) or "forwarded" (a SIGTERM that was
    not a preemption, passed to the program)."""

    def __init__(self, reason):
        self.reason = reason
        self.decided = threading.Event()
        self.outcome = None
        self.message = ""
        self.checkpoint = None
        self.signalled = False
        self.interrupted = None  # a signal from Slurm that arrived during a periodic checkpoint
        self.from_peer = False  # asked by another rank of a multi-node srun step (step_checkpoint.request_peers)
        self.peers_asked = 0  # how many other ranks this evacuation asked to checkpoint too
        self.peer_nodes = 1  # the step's node count when it asked them (capped by the job's)
        self.evacuation_id = None  # shared by every rank's checkpoint of one passed-on evacuation

    def finish(self, outcome, message=""):
        """Record the outcome and wake every waiter."""
        self.outcome, self.message = outcome, message or self.message
        self.decided.set()

    def answer(self):
        """The control-socket reply (dict)."""
        if not self.decided.is_set():
            return {"outcome": Outcome.FAILED, "message": "the evacuation (%s) did not finish in time" % self.reason}
        return {"outcome": self.outcome, "message": self.message, "checkpoint": self.checkpoint}


class CheckpointableTask:
    """One checkpointable sandbox of ``supervisor`` (see module docstring).

    ``settings``: slurmbox.migrate.policy.CheckpointSettings; ``prefix``: runsc
    command prefix; ``spec``: the sandbox's OCI spec (dict); ``child_fds``:
    our duplicates of the (stdin, stdout, stderr) given to runsc, kept for a
    local restore and closed by ``close``; ``err_fd``: the job's stderr.
    ``proc``: the current runsc process (set by the supervisor).
    """

    def __init__(self, supervisor, settings, prefix, spec, child_fds, err_fd):
        self.sup = supervisor
        self.settings = settings
        self.prefix = prefix
        self.spec = spec
        self.child_fds = child_fds
        self.err_fd = err_fd
        self.proc = None
        self.lock = threading.Lock()
        self.evacuation = None
        self.closed = False
        self.gone = False  # the task's launcher disappeared (killed)
        self.checkpoint_flags = []  # e.g. runsc's CUDA checkpoint flag, set by the supervisor for GPU sandboxes

    # -- triggers ------------------------------------------------------------------------
    def on_signal(self, signum):
        """A signal the launcher forwarded. Returns True when it was consumed here.

        SIGTERM starts an evacuation if slurmctld says the job is being
        preempted (else it is passed on); while an evacuation runs, further
        SIGTERM/SIGCONT (Slurm ending the requeued job) are swallowed.
        """
        with self.lock:
            if self.evacuation is not None:
                if signum in (signal.SIGTERM, signal.SIGINT) and not self.evacuation.interrupted and (
                        self.evacuation.reason == "periodic" or self.evacuation.decided.is_set()):
                    # Delivered as the step's end once the image is safe, or, when the sandbox has just been
                    # resumed here, passed on to it again (after_exit).
                    self.evacuation.interrupted = signum
                return signum in (signal.SIGTERM, signal.SIGCONT, signal.SIGINT)
            if signum != signal.SIGTERM or self.closed:
                return False
            evacuation = self.evacuation = Evacuation("preemption")
        threading.Thread(target=self._on_term, args=(evacuation,), daemon=True).start()
        return True

    def start_preemption_watch(self, partition):
        """Poll slurmctld for a preemption of this job (see slurmbox.migrate.triggers); daemon thread.

        Only on partitions with PreemptMode=REQUEUE and a GraceTime: without
        grace time Slurm kills at once and nothing can be saved.
        """
        env = self.sup._slurm_env()
        try:
            grace, mode = triggers.partition_grace(partition, env=env)
        except scontrol.SlurmCommandError as err:
            self.sup.say(None, "cannot read partition %s (%s); preemption is noticed only by signal" % (partition, err))
            return
        if grace <= 0 or "REQUEUE" not in mode.upper():
            return
        interval = triggers.watch_interval(grace)

        def watch():
            while True:
                time.sleep(interval)
                with self.lock:
                    if self.closed or self.evacuation is not None:
                        return
                try:
                    if not triggers.preempted(self.sup.args.job, env=env):
                        continue
                except scontrol.SlurmCommandError:
                    continue
                with self.lock:
                    if self.closed or self.evacuation is not None:
                        return
                    evacuation = self.evacuation = Evacuation("preemption")
                self._evacuate(evacuation)
                return

        threading.Thread(target=watch, daemon=True).start()

    def start_periodic(self):
        """Take a checkpoint every ``settings.interval_s`` seconds (transparent mode), daemon thread.

        runsc's checkpoint stops the sandbox (the 2022 build cannot keep it
        running), so each periodic checkpoint is checkpoint + publish +
        restore here; the program sees only a pause.
        """
        if self.settings.mode != "transparent" or self.settings.interval_s <= 0:
            return

        def loop():
            while True:
                time.sleep(self.settings.interval_s)
                with self.lock:
                    if self.closed:
                        return
                    if self.evacuation is not None:
                        continue
                    evacuation = self.evacuation = Evacuation("periodic")
                self._evacuate(evacuation, requeue=False)

        threading.Thread(target=loop, daemon=True).start()

    def _on_term(self, evacuation):
        try:
            preempted = triggers.preempted(self.sup.args.job, env=self.sup._slurm_env())
        except scontrol.SlurmCommandError as err:
            self.sup.say(None, "cannot ask slurmctld whether SIGTERM is a preemption (%s); passing it on" % err)
            preempted = False
        if not preempted:
            request = self._peer_request()
            if request:  # another rank's node is being evacuated (spot notice, maintenance): checkpoint too
                evacuation.reason, evacuation.from_peer = request["reason"], True
                evacuation.evacuation_id = request["evacuation_id"]
                self._evacuate(evacuation)
                return
            with self.lock:
                self.evacuation = None
            self._kill(signal.SIGTERM)
            evacuation.finish(Outcome.FORWARDED)
            return
        self._evacuate(evacuation)

    def _peer_request(self):
        """Another rank's request that this rank checkpoint (step_checkpoint.take_peer_request), or None."""
        fields = self.sup.step_manifest
        if not fields or fields.get("step_nodes", 1) <= 1 or self.settings.mode not in ("transparent", "signal"):
            return None
        try:
            return take_peer_request(self.sup.store(), self.sup.args.job, self.sup.checkpoint_step,
                                     fields["restart_count"], fields["command_sha256"])
        except (CheckpointError, OSError):
            return None

    def _serve_peer_request(self, evacuation, ckpt):
        """Whether the SIGTERM that interrupted periodic checkpoint ``ckpt`` was another rank's request.

        A spot notice or maintenance on another node of a multi-node step
        asks this rank to checkpoint (step_checkpoint.request_peers) with a
        SIGTERM, which can arrive while a periodic checkpoint is being taken.
        That checkpoint, just published, is this rank's state at the request:
        it is reported to the rank that asked (PEER_DONE with its evacuation
        id, step_checkpoint.before_requeue) and the sandbox stays stopped,
        as after any checkpoint a peer asked for. Returns False when there is
        no request for this run (Slurm is ending the step).
        """
        request = self._peer_request()
        if not request:
            return False
        evacuation.reason, evacuation.from_peer = request["reason"], True
        evacuation.evacuation_id = request["evacuation_id"]
        self.sup.say(self.err_fd, "%s: another rank asked for a checkpoint while periodic checkpoint %s was being "
                     "taken; that checkpoint is this rank's" % (evacuation.reason, ckpt.name))
        before_requeue(self.sup, evacuation, ckpt, self.err_fd)  # from_peer: reports it done, decides "requeued"
        return True

    def evacuate(self, reason, wait=True):
        """Evacuate for ``reason`` (control socket); returns the Evacuation's answer dict."""
        with self.lock:
            if self.closed:
                return {"outcome": Outcome.UNSUPPORTED, "message": "the program of job %s has ended" % self.sup.args.job}
            evacuation, start = self.evacuation, self.evacuation is None
            if start:
                evacuation = self.evacuation = Evacuation(reason)
        if start:
            self._evacuate(evacuation)
        if wait:
            deadline = SIGNAL_DEADLINE_S if self.settings.mode == "signal" else EVACUATION_TIMEOUT_S
            if self.settings.mode == "signal" and evacuation.peers_asked:
                deadline += PEER_SIGNAL_WAIT_S  # after its own program, it waits for the other ranks' programs
            if not evacuation.decided.wait(deadline) and self.settings.mode == "signal":
                self.sup.say(self.err_fd, "the program did not exit within %.0f s of its checkpoint signal; "
                             "requeueing the job anyway" % deadline)
                self._requeue(evacuation, program_gone=False)
        return evacuation.answer()

    # -- the evacuation ------------------------------------------------------------------
    def _evacuate(self, evacuation, requeue=True):
        """Run one evacuation; an unexpected error is logged and still ends in a decided outcome
        (the job is requeued if it can be), so no waiter hangs."""
        try:
            self._evacuate_steps(evacuation, requeue)
        except Exception as err:  # never leave the step waiting on an undecided evacuation
            import traceback
            traceback.print_exc()
            self.sup.say(self.err_fd, "internal error while checkpointing job %s: %s" % (self.sup.args.job, err))
            if not evacuation.decided.is_set():
                try:
                    self._requeue(evacuation, program_gone=self.proc is not None and self.proc.poll() is not None)
                except Exception:
                    traceback.print_exc()
            if not evacuation.decided.is_set():
                evacuation.finish(Outcome.LOST if self.proc is not None and self.proc.poll() is not None else Outcome.FORWARDED,
                                  "internal error: %s" % err)

    def _evacuate_steps(self, evacuation, requeue):
        job = self.sup.args.job
        if requeue:
            evacuation.peers_asked = request_peers(self.sup, evacuation, self.err_fd)
        if self.settings.mode == "signal":
            evacuation.signalled = True
            self.sup.say(self.err_fd, "%s: sending signal %d to the program so it saves its state; the job is "
                         "requeued when it exits" % (evacuation.reason, self.settings.signal))
            self._kill(self.settings.signal)
            return  # decided in after_exit once the program has exited
        ckpt = None
        try:
            store = self.sup.store()
            pending = store.begin(job, self.sup.checkpoint_step, self.sup.args.uid)
        except (CheckpointError, OSError) as err:
            if not requeue:  # periodic: nothing was stopped; try again next time
                self.sup.say(self.err_fd, "periodic checkpoint of job %s skipped: %s" % (job, err))
                with self.lock:
                    self.evacuation = None
                evacuation.finish(Outcome.FORWARDED)
                return
            pending, begin_error = None, str(err)
        try:
            if pending is None:
                raise CheckpointError(begin_error)
            for warning in store.warnings:
                self.sup.say(None, warning)
            fields = {"node": self.sup.args.node, "reason": evacuation.reason, "partition": self.sup.args.partition,
                      "batch_script": self.sup.args.batch_script, "hostname": self.spec.get("hostname"),
                      "runsc": runsc_description(self.prefix),
                      "batch_script_sha256": self.sup.batch_script_sha256()}
            fields.update(self.sup.step_manifest)  # an srun step's rank and command digest (step_checkpoint)
            if self.checkpoint_flags and getattr(self.sup, "accelerators", None):
                fields["accelerators"] = self.sup.accelerators  # their CUDA state is in the image
            if evacuation.evacuation_id:
                fields["evacuation_id"] = evacuation.evacuation_id
            ckpt, took = checkpoint_sandbox(self.prefix, self.sup.container_id, pending, fields, self.spec,
                                            self.checkpoint_flags, cache_dir=self.sup.node_dir)
            size_mb = sum(f.get("size", 0) for f in (ckpt.manifest or {}).get("files", [])) / 1e6
            evacuation.checkpoint = ckpt.path
            self.sup.say(self.err_fd, "%s: checkpointed job %s as %s (%.1f MB, runsc checkpoint %.2f s)"
                         % (evacuation.reason, job, ckpt.path, size_mb, took))
            if not requeue:
                if evacuation.interrupted == signal.SIGTERM and not self.gone and self._serve_peer_request(
                        evacuation, ckpt):
                    return
                if evacuation.interrupted or self.gone:
                    # Slurm is ending the step (requeue, scancel, node failure handling): do not start the
                    # sandbox again here; the next run restores this checkpoint.
                    evacuation.finish(Outcome.INTERRUPTED, "periodic checkpoint %s taken while the step was being "
                                      "ended" % ckpt.name)
                    self.sup.say(self.err_fd, evacuation.message)
                    return
                self._resume_here(evacuation, ckpt, "periodic checkpoint %s taken; the program continues"
                                  % ckpt.name)
                return
        except CheckpointFailed as err:
            self.sup.say(self.err_fd, "%s: checkpoint of job %s failed: %s. The sandbox has stopped; the job is "
                         "requeued and restarts from its previous checkpoint, or from the beginning"
                         % (evacuation.reason, job, err))
        except (CheckpointError, OSError) as err:
            self._kill(signal.SIGKILL)  # never leave a half-saved sandbox running unaccounted
            self.sup.say(self.err_fd, "%s: no checkpoint of job %s: %s. The job is requeued and restarts from its "
                         "previous checkpoint, or from the beginning" % (evacuation.reason, job, err))
        self._requeue(evacuation, program_gone=True, ckpt=ckpt)

    def _requeue(self, evacuation, program_gone, ckpt=None):
        job = self.sup.args.job
        if evacuation.reason == "periodic" and evacuation.interrupted == signal.SIGTERM and self._peer_request():
            # The periodic checkpoint failed while another rank was evacuating its node: requeueing now would
            # end that rank's checkpoint midway. It requeues the job once its wait for this rank is over.
            evacuation.finish(Outcome.REQUEUED, "the periodic checkpoint failed while another rank asked for one; "
                              "that rank requeues job %s (this rank restarts from its previous checkpoint)" % job)
            self.sup.say(self.err_fd, evacuation.message)
            return
        if not before_requeue(self.sup, evacuation, ckpt, self.err_fd):  # other ranks of a multi-node step
            return
        try:
            scontrol.requeue(job, env=self.sup._slurm_env())
        except scontrol.SlurmCommandError as err:
            if evacuation.reason == "preemption" or self._requeued_already():
                # At the end of GraceTime slurmctld requeues the job itself (PreemptMode=REQUEUE), or
                # another node's evacuation requeued it first; either way a second requeue is refused.
                evacuation.finish(Outcome.REQUEUED, "job %s is requeued (%s)%s"
                                  % (job, "by Slurm: preemption" if evacuation.reason == "preemption"
                                     else "by another node's evacuation", ", checkpoint %s" % ckpt.name if ckpt else ""))
                self.sup.say(self.err_fd, evacuation.message)
            elif ckpt is not None:
                self._resume_here(evacuation, ckpt, "job %s could not be requeued (%s); it continues here from "
                                  "checkpoint %s" % (job, err, ckpt.name))
            elif program_gone:
                evacuation.finish(Outcome.LOST, "job %s could not be requeued (%s) and its program has stopped" % (job, err))
                self.sup.say(self.err_fd, evacuation.message)
            else:
                evacuation.finish(Outcome.FORWARDED, "job %s could not be requeued: %s" % (job, err))
                self.sup.say(self.err_fd, evacuation.message)
            return
        evacuation.finish(Outcome.REQUEUED, "job %s requeued (%s)%s" % (job, evacuation.reason,
                                                                 ", checkpoint %s" % ckpt.name if ckpt else ""))
        self.sup.say(self.err_fd, evacuation.message)

    def _requeued_already(self):
        """Whether the job has left this run: no longer RUNNING, or restarted (another rank's node's
        evacuation requeued it while this one was checkpointing)."""
        try:
            record = scontrol.show_job(self.sup.args.job, env=self.sup._slurm_env())
        except scontrol.SlurmCommandError:
            return False
        restarts = str(record.get("Restarts", "0"))
        return record.get("JobState") != "RUNNING" or (
            restarts.isdigit() and int(restarts) > int(self.sup.step_manifest.get("restart_count", 0) or 0)
            and bool(self.sup.step_manifest))

    def _resume_here(self, evacuation, ckpt, why):
        if self.gone:
            evacuation.finish(Outcome.LOST, "the step ended while job %s was being checkpointed" % self.sup.args.job)
            return
        runsc.delete(self.prefix, self.sup.container_id)
        flags = restore_flags(self.sup._runsc_features(), ckpt.manifest)
        proc = runsc.spawn(restore_argv(self.prefix, ckpt.path, self.sup.bundle_dir, self.sup.container_id, flags),
                           stdin=self.child_fds[0], stdout=self.child_fds[1], stderr=self.child_fds[2],
                           close_fds=True, start_new_session=True)
        self.proc = proc
        self._wait_running(proc)  # a signal until then is held (on_signal) and handled again (after_exit)
        evacuation.finish(Outcome.RESUMED, why)
        self.sup.say(self.err_fd if evacuation.reason != "periodic" else None, evacuation.message)

    def after_exit(self):
        """Called when the runsc process exited: the outcome of an evacuation that stopped it, or None.

        Returns "requeued", "resumed" (``proc`` is the new process), "lost",
        or None when the program simply ended (or a SIGTERM was passed on).
        """
        with self.lock:
            evacuation = self.evacuation
        if evacuation is None:
            return None
        if evacuation.signalled and not evacuation.decided.is_set():
            self.sup.say(self.err_fd, "the program exited after its checkpoint signal")
            self._requeue(evacuation, program_gone=False)
        evacuation.decided.wait()
        if evacuation.outcome == Outcome.RESUMED:
            with self.lock:
                if self.evacuation is evacuation:
                    self.evacuation = None
            if evacuation.interrupted:  # arrived while the sandbox was being resumed: it was not acted on
                threading.Thread(target=self._redeliver, args=(evacuation.interrupted,), daemon=True).start()
            return Outcome.RESUMED
        if evacuation.outcome in (Outcome.REQUEUED, Outcome.LOST, Outcome.INTERRUPTED):
            return evacuation.outcome
        return None

    def _wait_running(self, proc, timeout=RESUME_WAIT_S):
        """Return once the sandbox restored by ``proc`` (``runsc restore``) runs (``runsc state``), ``proc``
        exited (the restore failed), or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            state = runsc.state(self.prefix, self.sup.container_id)
            if state is not None and str(state.get("status", "")).lower() == "running":
                return
            time.sleep(0.1)

    def _redeliver(self, signum):
        """Handle ``signum`` again now that the sandbox resumed here runs: a SIGTERM that came while it was
        being restored is a preemption, another rank's request or the step's end, as any other."""
        if not self.on_signal(signum):
            self._kill(signum)

    # -- end -----------------------------------------------------------------------------
    def _kill(self, signum):
        self.sup._kill(self.prefix, [self.sup.container_id], signum)

    def close(self):
        """The task is over: close our stdio duplicates (idempotent)."""
        with self.lock:
            self.closed = True
            fds, self.child_fds = self.child_fds, []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def forget_checkpoints(self):
        """The program ended on its own: remove this step's checkpoints (they would restore a finished job)."""
        if self.settings.mode != "transparent":
            return
        try:
            self.sup.store().remove_step(self.sup.args.job, self.sup.checkpoint_step)
        except (OSError, CheckpointError) as err:
            self.sup.say(None, "cannot remove the finished job's checkpoints: %s" % err)
