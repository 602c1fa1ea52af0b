"""Human-readable tables and comparisons of campaign records (``slurmbox measure report``)."""

import numpy as np

from slurmbox.measure import stats

#: Fingerprint keys that must match for a comparison to mean something.
COMPARABLE_KEYS = ("node", "cpu_model", "kernel", "sandbox_cpus", "harness_cpus", "isolation")


def _ms(value):
    return "-" if value is None else "%.4f" % (value / 1e6)


def timed_samples(candidate):
    """The timed samples (ns, numpy array) of a candidate dict from records.read_campaign."""
    samples = candidate["samples"]
    return np.asarray(samples["wall_ns"])[np.asarray(samples["kind"]) == 1]


def summary_rows(campaign):
    """One JSON-ready row per candidate of a campaign dict (records.read_campaign)."""
    rows = []
    for cand in campaign["candidates"]:
        summary = cand["summary"]
        rows.append({"file": campaign["path"], "task": campaign["task"], "label": cand["label"],
                     "verdict": cand["verdict"], "reward_ns": cand["reward_ns"], "converged": cand["converged"],
                     "count": summary.get("count", 0), "median_ns": summary.get("median_ns"),
                     "mean_ns": summary.get("mean_ns"), "rel_stdev": summary.get("rel_stdev"),
                     "iqr_ns": summary.get("iqr_ns"), "outliers": summary.get("outliers"),
                     "overhead_ns": cand["overhead_ns"], "flags": cand["flag_reasons"],
                     "node": cand["fingerprint"].get("node", ""),
                     "sandbox_cpus": cand["fingerprint"].get("sandbox_cpus", "")})
    return rows


def format_table(rows):
    """Fixed-width text table of summary_rows (times in ms)."""
    header = ("candidate", "verdict", "n", "median_ms", "mean_ms", "rel_sd%", "iqr_ms", "outl", "conv", "flags")
    lines = [header]
    for row in rows:
        rel = row["rel_stdev"]
        lines.append((row["label"], row["verdict"], str(row["count"]), _ms(row["median_ns"]), _ms(row["mean_ns"]),
                      "-" if rel is None or rel == float("inf") else "%.2f" % (100 * rel),
                      _ms(row["iqr_ns"]), str(row["outliers"] if row["outliers"] is not None else "-"),
                      "yes" if row["converged"] else "NO", ",".join(row["flags"]) or "-"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines)


def fingerprint_differences(a, b):
    """Keys of COMPARABLE_KEYS (and GPU presence) whose values differ between two candidate dicts."""
    fa, fb = a["fingerprint"], b["fingerprint"]
    diffs = [k for k in COMPARABLE_KEYS if fa.get(k) != fb.get(k)]
    if fa.get("gpu", {}).get("devices") != fb.get("gpu", {}).get("devices"):
        diffs.append("gpu")
    return diffs


def compare_campaigns(first, second):
    """Compare candidates of two campaign dicts: the same labels in both, or the only
    candidate of each. Returns a list of dicts (labels, stats.compare result or an
    ``error``, ``fingerprint_differences``)."""
    by_label = {c["label"]: c for c in second["candidates"]}
    pairs = [(c, by_label[c["label"]]) for c in first["candidates"] if c["label"] in by_label]
    if not pairs and len(first["candidates"]) == 1 and len(second["candidates"]) == 1:
        pairs = [(first["candidates"][0], second["candidates"][0])]
    out = []
    for a, b in pairs:
        entry = {"a": a["label"], "b": b["label"], "a_verdict": a["verdict"], "b_verdict": b["verdict"],
                 "fingerprint_differences": fingerprint_differences(a, b)}
        try:
            entry.update(stats.compare(timed_samples(a), timed_samples(b)))
        except ValueError as err:
            entry["error"] = str(err)
        out.append(entry)
    return out


def format_comparison(entries, first_path, second_path):
    """Text lines for compare_campaigns output."""
    if not entries:
        return "no candidate label appears in both %s and %s" % (first_path, second_path)
    lines = ["A = %s, B = %s" % (first_path, second_path)]
    for e in entries:
        title = "%s (A) vs %s (B)" % (e["a"], e["b"])
        if "error" in e:
            lines.append("%s: cannot compare: %s" % (title, e["error"]))
            continue
        lines.append("%s: median ratio A/B %.4f, %d%% CI [%.4f, %.4f], Mann-Whitney U %.0f, p = %.3g, "
                     "Hodges-Lehmann shift %.4f ms -> %s"
                     % (title, e["median_ratio"], round(100 * e["confidence"]), e["ratio_ci"][0], e["ratio_ci"][1],
                        e["mannwhitney_u"], e["p_value"], e["hodges_lehmann_ns"] / 1e6,
                        ("A faster" if e["median_ratio"] < 1 else "A slower") if e["significant"]
                        else "no significant difference"))
        if e["a_verdict"] != "accepted" or e["b_verdict"] != "accepted":
            lines.append("  note: verdicts %s / %s (a rejected candidate earns no reward)"
                         % (e["a_verdict"], e["b_verdict"]))
        if e["fingerprint_differences"]:
            lines.append("  warning: measured under different conditions: %s" % ", ".join(e["fingerprint_differences"]))
    return "\n".join(lines)
