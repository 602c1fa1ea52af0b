"""Checkpoint/restore benchmark: throughput against plain file I/O, and preemption downtime.

Part 1 (no Slurm): a sandbox (runsc, same global flags slurmbox uses) holds
64, 256 and 1024 MB of touched, incompressible memory (Python
``random.randbytes``). For each size, interleaved with a plain sequential
write and read of the same number of bytes to the same file system:

- checkpoint = ``runsc checkpoint`` into a slurmbox CheckpointStore + publish
  (sha256 and fsync of every file, manifest, atomic rename);
- restore = verify (chunked sha256 against the manifest) + ``runsc restore
  --detach`` (with the flags slurmbox passes: ``--direct`` for an image
  written with it) until the sandbox runs, with the image evicted from the
  page cache first (posix_fadvise DONTNEED), as on a node that did not write it;
- plain write = write + fsync of the same bytes; plain read = cold read of them.

Runs alternate which of the two goes first (see throughput); use an even
``--runs`` for a balanced order.

Printed as MB/s and as ratios (goal: checkpoint >= 0.70 of plain write;
restore no slower than checkpoint), and the same ratios for runsc alone
(``runsc checkpoint``; ``runsc restore`` without the verification): the
ceiling slurmbox's own work (digests, fsync, publish, verify) is measured
against. ``--runsc PATH`` runs part 1 with another
runsc binary (e.g. Debian 13's, extracted next to Debian 12's), and
``--compression``/``--no-direct`` choose the ``runsc checkpoint`` flags where
that runsc has them (slurmbox.migrate.runsc_checkpoint; the 2022 build has neither
and always compresses).

Part 2 (dev cluster, skipped with ``--no-cluster``): the time from a Slurm
preemption (a higher-priority job submitted) and from ``slurmbox migrate``
until the sandboxed job runs again on the other node and prints again. It
uses the runsc slurmbox finds on the nodes (sandbox/runsc.py find_runsc).

    python benchmarks/checkpoint_throughput.py --sizes 64 256 1024 --runs 3
    python benchmarks/checkpoint_throughput.py --no-cluster --runsc /tmp/runsc-trixie/x/usr/bin/runsc
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from slurmbox.sandbox import runsc

from polling import became_true, wait_until  # benchmarks/polling.py, beside this script

HOLDER = ("import random, sys, time\n"
          "data = [random.randbytes(1 << 20) for _ in range(int(sys.argv[1]))]\n"
          "print('ready', flush=True)\n"
          "time.sleep(3600)\n")


def runsc_prefix(state, binary=None):
    from slurmbox.sandbox import runsc

    binary = os.path.abspath(binary) if binary else runsc.find_runsc()
    caps = runsc.capabilities(binary, state)
    return runsc.global_args(binary, os.path.join(state, "runsc"), runsc.choose_platform("auto", caps), "none")


def write_bundle(directory, megabytes):
    spec = {"ociVersion": "1.0.0",
            "process": {"terminal": False, "user": {"uid": 65534, "gid": 65534},
                        "args": ["/usr/bin/python3", "-c", HOLDER, str(megabytes)],
                        "env": ["PATH=/usr/bin:/bin"], "cwd": "/"},
            "root": {"path": "/", "readonly": True}, "hostname": "bench",
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}],
            "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"},
                                     {"type": "network"}]}}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as handle:
        json.dump(spec, handle)
    return spec


def evict(path):
    """Drop ``path``'s pages from the page cache (posix_fadvise(2) POSIX_FADV_DONTNEED)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def plain_write(path, nbytes, chunk):
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = nbytes
        while left:
            left -= os.write(fd, chunk[:min(left, len(chunk))])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def plain_read(path):
    evict(path)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.read(1 << 20):
            pass
    return time.perf_counter() - start


def one_sandbox(prefix, work, store, megabytes, index, direct=None):
    """(checkpoint s, runsc part s, restore s, verify part s, image bytes) for one sandbox."""
    from slurmbox.migrate.runsc_checkpoint import checkpoint_features, checkpoint_sandbox, restore_flags

    bundle = os.path.join(work, "bundle-%d" % megabytes)
    spec = write_bundle(bundle, megabytes)
    cid = "bench-%d-%d-%d" % (os.getpid(), megabytes, index)
    proc = runsc.spawn(prefix + ["run", "--bundle", bundle, cid])
    try:
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("the benchmark sandbox did not start: %s" % proc.stderr.read().decode()[-500:])
        pending = store.begin("bench", "s%d" % megabytes, 0)
        start = time.perf_counter()
        ckpt, runsc_s = checkpoint_sandbox(prefix, cid, pending, {"node": "bench", "reason": "benchmark"}, spec,
                                           cache_dir=os.path.join(work, "state"), direct=direct)
        checkpoint_s = time.perf_counter() - start
        proc.wait(timeout=60)
        runsc.delete(prefix, cid)
        image = sum(f["size"] for f in ckpt.manifest["files"])
        for entry in ckpt.manifest["files"]:
            evict(os.path.join(ckpt.path, entry["name"]))
        flags = restore_flags(checkpoint_features(prefix[0], os.path.join(work, "state")), ckpt.manifest)
        start = time.perf_counter()
        verdict = store.verify(ckpt, direct="--direct" in flags)  # as slurmbox.migrate.restore does
        verify_s = time.perf_counter() - start
        if not verdict.valid:
            raise RuntimeError("benchmark checkpoint does not verify: %s" % verdict.problems)
        # Detached: runsc returns once the sandbox runs. Its stdio goes to a file of ours (never
        # /dev/null, which runsc would re-own; never a pipe, which the sandbox would keep open).
        with open(os.path.join(work, "restore-%d.log" % megabytes), "w+") as log:
            restored = runsc.spawn(prefix + ["restore", "--detach", *flags, "--image-path", ckpt.path,
                                             "--bundle", bundle, cid], stdin=log, stdout=log, stderr=log)
            restored.wait()
            restore_s = time.perf_counter() - start
            log.seek(0)
            if restored.returncode != 0:
                raise RuntimeError("runsc restore failed: %s" % log.read()[-500:])
        return checkpoint_s, runsc_s, restore_s, verify_s, image, ckpt.manifest["runsc"]
    finally:
        runsc.kill(prefix, cid, "KILL")
        runsc.delete(prefix, cid)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        store.remove_step("bench", "s%d" % megabytes)


def throughput(sizes, runs, directory, binary=None, compression="none", direct=None):
    from slurmbox.migrate.store import CheckpointStore

    work = tempfile.mkdtemp(prefix="sbx-ckpt-bench-", dir=directory)
    try:
        store = CheckpointStore(os.path.join(work, "store"), keep_last=1, compression=compression)
        prefix = runsc_prefix(os.path.join(work, "state"), binary)
        print("load average %s; runsc %s" % (" ".join("%.2f" % x for x in os.getloadavg()), " ".join(prefix)),
              flush=True)
        described = None
        chunk = os.urandom(8 << 20)
        rows = []
        for megabytes in sizes:
            samples = {k: [] for k in ("ckpt", "runsc", "restore", "verify", "write", "read", "image")}
            for index in range(runs):
                # Alternate which goes first (A B, B A, ...): on virtual disks with a write-back cache on
                # the host, whatever follows a large write pays for flushing it.
                plain = os.path.join(work, "plain.bin")
                if index % 2:
                    write_s = plain_write(plain, megabytes << 20, chunk)
                    read_s = plain_read(plain)
                    os.unlink(plain)
                ckpt_s, runsc_s, restore_s, verify_s, image, described = one_sandbox(prefix, work, store, megabytes,
                                                                                     index, direct)
                if not index % 2:
                    write_s = plain_write(plain, megabytes << 20, chunk)
                    read_s = plain_read(plain)
                    os.unlink(plain)
                for key, value in (("ckpt", ckpt_s), ("runsc", runsc_s), ("restore", restore_s), ("verify", verify_s),
                                   ("write", write_s), ("read", read_s), ("image", image)):
                    samples[key].append(value)
            med = {k: statistics.median(v) for k, v in samples.items()}
            mb = float(megabytes)
            rows.append({"MB": megabytes, "image_MB": med["image"] / 1e6, "runsc": described,
                         "load_average": os.getloadavg()[0],
                         "checkpoint_s": med["ckpt"], "runsc_checkpoint_s": med["runsc"],
                         "restore_s": med["restore"], "verify_s": med["verify"],
                         "plain_write_s": med["write"], "plain_read_s": med["read"],
                         "checkpoint_MBps": mb / med["ckpt"], "restore_MBps": mb / med["restore"],
                         "plain_write_MBps": mb / med["write"], "plain_read_MBps": mb / med["read"],
                         "checkpoint_vs_write": med["write"] / med["ckpt"],
                         "restore_vs_read": med["read"] / med["restore"],
                         "restore_vs_checkpoint": med["ckpt"] / med["restore"],
                         # What runsc alone allows, without slurmbox's digests, fsync and publish: the ceiling.
                         "runsc_checkpoint_vs_write": med["write"] / med["runsc"],
                         "runsc_restore_vs_runsc_checkpoint": med["runsc"] / max(med["restore"] - med["verify"], 1e-6)})
            print("%5d MB (image %.0f MB): checkpoint %.2f s (runsc %.2f) = %.0f MB/s, plain write %.2f s = %.0f MB/s, "
                  "ratio %.2f | restore %.2f s (verify %.2f) = %.0f MB/s, plain read %.2f s = %.0f MB/s, ratio %.2f | "
                  "restore/checkpoint speed %.2f"
                  % (megabytes, med["image"] / 1e6, med["ckpt"], med["runsc"], mb / med["ckpt"], med["write"],
                     mb / med["write"], med["write"] / med["ckpt"], med["restore"], med["verify"], mb / med["restore"],
                     med["read"], mb / med["read"], med["read"] / med["restore"], med["ckpt"] / med["restore"]),
                  flush=True)
            print("        runsc alone: checkpoint %.2f s, ratio to plain write %.2f | restore %.2f s, x its checkpoint "
                  "speed %.2f" % (med["runsc"], rows[-1]["runsc_checkpoint_vs_write"], med["restore"] - med["verify"],
                                  rows[-1]["runsc_restore_vs_runsc_checkpoint"]), flush=True)
        print("runsc %s, checkpoint flags %s, image compression %s, image digest %s; load average now %s"
              % (described["version"], " ".join(described["checkpoint_flags"]) or "(none)",
                 described["image_compression"], described.get("image_digest"),
                 " ".join("%.2f" % x for x in os.getloadavg())), flush=True)
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


COUNTER = "i=0; while :; do i=$((i+1)); echo $i; sleep 0.02; done"


def resume_check(binary=None, directory="/var/tmp", compression="none", restore_binary=None):
    """Checkpoint a counting sandbox through slurmbox's code path and restore it; the count must go on.

    ``binary``: runsc for run + checkpoint (default the installed one);
    ``restore_binary``: runsc for the restore (default the same; another
    one checks whether images move between runsc versions). Returns a dict:
    ``ok`` (bool), ``lines`` (numbers printed), ``message`` (what failed).
    """
    from slurmbox.migrate.runsc_checkpoint import checkpoint_features, checkpoint_sandbox, restore_argv, restore_problem
    from slurmbox.migrate.store import CheckpointStore

    work = tempfile.mkdtemp(prefix="sbx-ckpt-resume-", dir=directory)
    prefix = runsc_prefix(os.path.join(work, "state"), binary)
    restore_prefix = prefix if not restore_binary else runsc_prefix(os.path.join(work, "state"), restore_binary)
    bundle = os.path.join(work, "bundle")
    spec = write_bundle(bundle, 0)
    spec["process"]["args"] = ["/bin/sh", "-c", COUNTER]
    with open(os.path.join(bundle, "config.json"), "w") as handle:
        json.dump(spec, handle)
    out = os.path.join(work, "count.out")
    cid = "resume-%d" % os.getpid()
    store = CheckpointStore(os.path.join(work, "store"), keep_last=1, compression=compression)
    procs = []

    def lines():
        with open(out) as handle:
            return handle.read().split()

    def wait_lines(n, timeout=60):
        return became_true(lambda: len(lines()) >= n, timeout, interval=0.02)

    try:
        # stdin: a pipe of ours. runsc re-owns the stdio it is given to the sandbox's user,
        # so it must never get /dev/null.
        with open(out, "a") as log:
            procs.append(runsc.spawn(prefix + ["run", "--bundle", bundle, cid], stdout=log))
            if not wait_lines(20):
                why = procs[0].stderr.read().decode()[-300:] if procs[0].poll() is not None else "no output"
                return {"ok": False, "lines": 0, "message": "the counter did not start: %s" % why}
            ckpt, _took = checkpoint_sandbox(prefix, cid, store.begin("resume", "batch", 0),
                                             {"node": "bench", "reason": "resume-check"}, spec,
                                             cache_dir=os.path.join(work, "state"))
            procs[0].wait(timeout=60)
            runsc.delete(prefix, cid)
            seen = len(lines())
            version_check = restore_problem(ckpt.manifest, checkpoint_features(restore_prefix[0]))
            procs.append(runsc.spawn(restore_argv(restore_prefix, ckpt.path, bundle, cid), stdout=log))
            resumed = wait_lines(seen + 20, timeout=30)
        numbers = lines()
        if not resumed:
            failed = procs[1].poll()
            detail = procs[1].stderr.read().decode().strip().splitlines() if failed is not None else []
            return {"ok": False, "lines": len(numbers), "message": "no output after restore (runsc restore %s%s)%s"
                    % ("exit %s" % failed if failed is not None else "still running",
                       ": " + detail[-1] if detail else "",
                       "; slurmbox's version check would have refused it: %s" % version_check if version_check
                       else "")}
        expected = [str(i) for i in range(1, len(numbers) + 1)]
        if numbers != expected:
            bad = next(i for i, (a, b) in enumerate(zip(numbers, expected)) if a != b)
            return {"ok": False, "lines": len(numbers), "message": "sequence broken at line %d: %s"
                    % (bad + 1, " ".join(numbers[max(0, bad - 2):bad + 3]))}
        return {"ok": True, "lines": len(numbers), "message": "%d before the checkpoint, %d after, no gap or repeat"
                % (seen, len(numbers) - seen), "manifest_runsc": ckpt.manifest["runsc"]}
    finally:
        for pre in (prefix, restore_prefix):
            runsc.kill(pre, cid, "KILL")
            runsc.delete(pre, cid)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def downtime(slurm_conf, runs):
    """Seconds from preemption / migrate until the job runs (and prints) again, median over ``runs``."""
    from slurmbox.slurm_client import scontrol

    env = dict(os.environ, SLURM_CONF=slurm_conf)
    user = "sbxuser"
    home = os.path.expanduser("~%s" % user)
    work = tempfile.mkdtemp(prefix="sbx-bench-", dir=home)
    subprocess.run(["chown", user, work], check=True)
    script = os.path.join(work, "count.sh")
    with open(script, "w") as handle:
        handle.write("#!/bin/sh\n#SBATCH --sandbox\n#SBATCH -p spot -N1 -n1 --requeue --open-mode=append\n"
                     "i=0\nwhile :; do i=$((i+1)); echo \"$i\"; sleep 0.05; done\n")
    os.chmod(script, 0o755)

    def as_user(*cmd):
        return subprocess.run(["runuser", "-u", user, "--", "env", "SLURM_CONF=%s" % slurm_conf] + list(cmd),
                              capture_output=True, text=True, cwd=work, check=True).stdout.strip()

    def state(job):
        record = scontrol.show_job(job, env=env)
        return record.get("JobState"), record.get("NodeList")

    def wait(predicate, timeout=300):
        return wait_until(predicate, timeout, "the dev cluster job")

    def count(path):
        try:
            with open(path) as handle:
                return handle.read().count("\n")
        except OSError:
            return 0

    results = {"preemption": [], "migrate": []}
    try:
        for _ in range(runs):
            for how in ("preemption", "migrate"):
                out = os.path.join(work, "%s.out" % how)
                job = as_user("sbatch", "--parsable", "-o", out, "-e", out + ".err", script).split(";")[0]
                node = wait(lambda: state(job)[1] if state(job)[0] == "RUNNING" else None)
                wait(lambda: count(out) >= 20)
                start = time.monotonic()
                if how == "preemption":
                    blocker = as_user("sbatch", "--parsable", "-p", "ondemand", "-w", node, "--exclusive", "-o",
                                      "/dev/null", "--wrap", "sleep 300")
                else:
                    blocker = None
                    subprocess.run(["slurmbox", "migrate", "--node", node, "--slurm-conf", slurm_conf],
                                   capture_output=True, env=env, check=True)
                seen = count(out)
                wait(lambda: state(job)[0] == "RUNNING" and state(job)[1] != node)
                running = time.monotonic() - start
                wait(lambda: count(out) > seen + 2 and "restoring" in open(out + ".err").read())
                printing = time.monotonic() - start
                results[how].append((running, printing))
                print("%s: running again on the other node after %.1f s, printing after %.1f s"
                      % (how, running, printing), flush=True)
                subprocess.run(["scancel", job] + ([blocker] if blocker else []), env=env)
                subprocess.run(["scontrol", "update", "NodeName=%s" % node, "State=RESUME"], env=env,
                               capture_output=True)
                wait(lambda: state(job)[0] not in ("RUNNING", "COMPLETING"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {how: {"running_again_s": statistics.median(r for r, _ in v), "printing_again_s":
                  statistics.median(p for _, p in v)} for how, v in results.items() if v}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024], help="MB of touched memory")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default="/var/tmp", help="file system for the store and the plain file")
    parser.add_argument("--no-cluster", action="store_true", help="skip the preemption downtime part")
    parser.add_argument("--no-throughput", action="store_true", help="skip the throughput part")
    parser.add_argument("--slurm-conf", help="use this running dev cluster (else one is started)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--runsc", help="runsc binary for the throughput part (default: the installed one, "
                        "as slurmbox finds it)")
    parser.add_argument("--compression", default="none", choices=("none", "flate-best-speed"),
                        help="checkpoint_store.compression to benchmark (runsc without -compression always "
                        "compresses)")
    parser.add_argument("--resume-check", action="store_true", help="first checkpoint and restore a counting "
                        "sandbox with --runsc (and with --restore-runsc for the restore) and check the count goes on")
    parser.add_argument("--restore-runsc", help="runsc binary for --resume-check's restore (default: --runsc)")
    parser.add_argument("--no-direct", dest="direct", action="store_const", const=False, default=None,
                        help="do not pass -direct (O_DIRECT pages file) to runsc checkpoint (slurmbox passes it "
                        "where runsc has it and the file system takes O_DIRECT)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (runsc checkpoint/restore and the dev cluster need it)")
    if args.runsc and not os.access(args.runsc, os.X_OK):
        sys.exit("--runsc %s: not an executable file" % args.runsc)
    results = {}
    if args.resume_check:
        results["resume_check"] = resume_check(args.runsc, args.dir, args.compression, args.restore_runsc)
        print("resume check (runsc %s, restored by %s): %s, %s" % (
            args.runsc or "installed", args.restore_runsc or "the same", "OK" if results["resume_check"]["ok"]
            else "FAILED", results["resume_check"]["message"]), flush=True)
    results.update({} if args.no_throughput else {"throughput": throughput(args.sizes, args.runs, args.dir, args.runsc,
                                                                      args.compression, args.direct)})
    if not args.no_cluster:
        if args.runsc:
            print("downtime part: the dev cluster's nodes use the installed runsc, not %s" % args.runsc, flush=True)
        cluster = None
        conf = args.slurm_conf
        if not conf:
            from slurmbox.dev_cluster.cluster import DevCluster, claim_free_subnet
            directory = tempfile.mkdtemp(prefix="sbxbench-", dir="/tmp")
            os.rmdir(directory)
            cluster = DevCluster(directory, nodes=2, gpus_per_node=0, subnet=claim_free_subnet(200, 249))
            conf = cluster.up()
        try:
            results["downtime"] = downtime(conf, args.runs)
            print(json.dumps(results["downtime"], indent=1))
        finally:
            if cluster:
                cluster.down()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
