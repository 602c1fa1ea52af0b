"""Campaign records in HDF5 (h5py): one file per campaign, one group per candidate.

Layout (format ``slurmbox-measure/1``)::

    /                      attrs: format, task, task_path, task_sha256, created_utc
    /candidates/<label>/   attrs: verdict, reward_ns (NaN when withheld), converged,
                                  flag_reasons, flags_json, summary_json, candidate,
                                  candidate_sha256, seed_sha256, overhead_ns,
                                  node, cpu_model, harness_cpus, sandbox_cpus, kernel,
                                  gpu_present, gpu_json, sandbox_json, fingerprint_json,
                                  stdout, stderr (first 64 KiB each)
        kind, wall_ns, cpu_ns, quiet_wall_ns, quiet_cpu_ns, claimed_ns, correct, throttle,
        sm_clock_mhz       per-sample datasets, equal length (kind: 0 warmup,
                           1 timed, 2 hidden-shape probe, 3 repeat probe;
                           throttle: NVML throttle-reason bits, 0 = clean;
                           sm_clock_mhz: lowest SM clock of the GPUs after the sample;
                           -1 where a value is unavailable)
"""

import json
import math
import time

FORMAT = "slurmbox-measure/1"
SAMPLE_FIELDS = ("kind", "wall_ns", "cpu_ns", "quiet_wall_ns", "quiet_cpu_ns", "claimed_ns", "correct", "throttle",
                 "sm_clock_mhz")


class RecordError(ValueError):
    """The file is not a slurmbox measurement record (or is damaged)."""


def group_name(label):
    """An HDF5-safe group name for a candidate label ('/' and '.' prefixes replaced)."""
    name = label.replace("/", "_").strip() or "candidate"
    return "_" + name if name.startswith(".") else name


def write_campaign(path, task, results, task_sha256=""):
    """Write ``results`` (list of harness.CandidateResult) for ``task`` to a new HDF5 file ``path``.

    Writes to a new temporary file next to ``path`` (mode 0644) and renames it, so a reader
    never sees half a file. The temporary file is created with O_EXCL under a random name
    and written through its descriptor: the harness runs as root, often in a directory
    others can write, where a fixed name could be a symlink planted to make root
    overwrite another file. Raises OSError.
    """
    import h5py

    from slurmbox.atomic_file import replace_atomically
    with replace_atomically(path) as stream, h5py.File(stream, "w") as handle:
        _write_groups(handle, task, results, task_sha256)


def _write_groups(handle, task, results, task_sha256):
    handle.attrs["format"] = FORMAT
    handle.attrs["task"] = task.name
    handle.attrs["task_path"] = task.path
    handle.attrs["task_sha256"] = task_sha256
    handle.attrs["created_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    parent = handle.create_group("candidates")
    for result in results:
        group = parent.create_group(group_name(result.label))
        for key in SAMPLE_FIELDS:
            if key in result.samples:
                group.create_dataset(key, data=result.samples[key])
        fp = result.fingerprint
        attrs = {
            "label": result.label, "verdict": result.verdict,
            "reward_ns": float("nan") if result.reward_ns is None else float(result.reward_ns),
            "converged": bool(result.converged),
            "flag_reasons": ",".join(sorted({f.reason for f in result.flags})),
            "flags_json": json.dumps([f.to_json() for f in result.flags]),
            "summary_json": json.dumps(result.summary),
            "candidate": result.candidate_path, "candidate_sha256": result.candidate_sha256,
            "seed_sha256": result.seed_sha256,
            "overhead_ns": float("nan") if result.overhead_ns is None else float(result.overhead_ns),
            "wall_s": float(result.wall_s),
            "node": fp.get("node", ""), "cpu_model": fp.get("cpu_model", ""), "kernel": fp.get("kernel", ""),
            "harness_cpus": fp.get("harness_cpus", ""), "sandbox_cpus": fp.get("sandbox_cpus", ""),
            "gpu_present": bool(fp.get("gpu", {}).get("present", False)),
            "gpu_json": json.dumps(fp.get("gpu", {})),
            "sandbox_json": json.dumps(result.sandbox_config),
            "fingerprint_json": json.dumps(fp),
            "stdout": result.stdout, "stderr": result.stderr,
        }
        for key, value in attrs.items():
            group.attrs[key] = value


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def read_campaign(path):
    """Read a campaign file. Returns ``{"task": str, "created_utc": str, "path": str,
    "candidates": [dict]}``; each candidate dict has the attrs above decoded
    (flags, summary, fingerprint, sandbox as objects) and ``samples`` (dict of
    numpy arrays). Raises RecordError for a file that is not a record."""
    import h5py
    try:
        handle = h5py.File(path, "r")
    except OSError as err:
        raise RecordError("%s is not a readable HDF5 file (%s)" % (path, err))
    with handle:
        if _text(handle.attrs.get("format", "")) != FORMAT or "candidates" not in handle:
            raise RecordError("%s is not a slurmbox measurement record (format %r)"
                              % (path, _text(handle.attrs.get("format", ""))))
        out = {"path": path, "task": _text(handle.attrs.get("task", "")),
               "created_utc": _text(handle.attrs.get("created_utc", "")), "candidates": []}
        for name in handle["candidates"]:
            group = handle["candidates"][name]
            attrs = {k: (_text(v) if isinstance(v, (bytes, str)) else v) for k, v in group.attrs.items()}
            reward = float(attrs.get("reward_ns", float("nan")))
            overhead = float(attrs.get("overhead_ns", float("nan")))
            entry = {
                "label": attrs.get("label", name), "verdict": attrs.get("verdict", ""),
                "reward_ns": None if math.isnan(reward) else reward,
                "converged": bool(attrs.get("converged", False)),
                "flags": json.loads(attrs.get("flags_json", "[]")),
                "flag_reasons": [r for r in attrs.get("flag_reasons", "").split(",") if r],
                "summary": json.loads(attrs.get("summary_json", "{}")),
                "candidate": attrs.get("candidate", ""), "candidate_sha256": attrs.get("candidate_sha256", ""),
                "overhead_ns": None if math.isnan(overhead) else overhead,
                "fingerprint": json.loads(attrs.get("fingerprint_json", "{}")),
                "sandbox": json.loads(attrs.get("sandbox_json", "{}")),
                "stdout": attrs.get("stdout", ""), "stderr": attrs.get("stderr", ""),
                "samples": {key: group[key][()] for key in SAMPLE_FIELDS if key in group},
            }
            out["candidates"].append(entry)
    return out
