#!/usr/bin/env python3
"""Per kernel, what an ncu --csv --page details log says holds it back, in one line each.

  ncu_summary.py LOG [LOG ...]

LOG is what `ncu --csv --page details ...` printed (the application's own output and ncu's ==PROF== lines
mixed in are skipped). For each profiled launch: its duration, the SM and memory throughput (% of peak),
the issue slots used, the warps eligible per scheduler and cycle, achieved occupancy, registers per thread,
and the three warp stall reasons with the most cycles per issued instruction (the
smsp__average_warps_issue_stalled_* metrics). Every one of these is required: a launch without one of them
(a section or metric the run did not ask for, a value that is not a number, a duration in a unit not known
here) is an error naming the log and the kernel, and so is a LOG without a profiled launch (a kernel filter
that matched nothing); the exit status is then 1. Phase C's ncu_attention and ncu_layernorm steps print it;
docs/performance.md says how to read it. Standard library only: the device's Python runs it.

What ncu writes: a header of 20 columns ending in the rule columns ("Rule Name" .. "Estimated Speedup"); a
metric row fills the first 15 and ends in a comma (16 fields), a rule row leaves the metric columns empty and
fills the rule ones. Values have thousands separators ("302,048"); Duration is in ns, us or ms (or nsecond,
usecond, msecond); percentages have the unit "%".
"""
import csv
import math
import sys

STALL = "smsp__average_warps_issue_stalled_"
STALLS_SHOWN = 3
# (label, format, metric names as the sections print them or as --metrics names them)
FIELDS = [
    ("us", ".1f", ("Duration", "gpu__time_duration.sum")),
    ("sm%", ".1f", ("Compute (SM) Throughput",)),
    ("mem%", ".1f", ("Memory Throughput",)),
    ("issue%", ".1f", ("Issue Slots Busy", "smsp__issue_active.avg.pct_of_peak_sustained_active")),
    ("eligible", ".2f", ("Eligible Warps Per Scheduler", "smsp__warps_eligible.avg.per_cycle_active")),
    ("occupancy%", ".1f", ("Achieved Occupancy",)),
    ("regs", ".0f", ("Registers Per Thread", "launch__registers_per_thread")),
]
SCALE_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
               "second": 1e6, "s": 1e6}
COLUMNS = ("ID", "Kernel Name", "Metric Name", "Metric Value")  # and "Metric Unit" where the log has it


def number(text):
    """'3,199,562,100.50' -> 3199562100.5; None for what is not a finite number ('n/a', '', 'PolicySpread')."""
    try:
        v = float(text.replace(",", "").strip())
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def short_name(kernel):
    """'void ns::(anonymous namespace)::attention_bwd_tc<64>(...)' -> 'attention_bwd_tc<64>'."""
    head = kernel.replace("(anonymous namespace)::", "").split("(", 1)[0].split()
    return head[-1].split("::")[-1] if head else kernel


def launches(paths):
    """{(log, launch id, kernel): {metric name: (value, unit)}} in the order the logs give them.

    A launch seen only in rule rows (no metric name) is there with no metrics, so that it is reported."""
    out = {}
    for path in paths:
        with open(path, errors="replace") as f:
            lines = [l for l in f if l.startswith('"')]
        col = None
        for row in csv.reader(lines):
            if "Metric Name" in row and "Kernel Name" in row:
                col = {name: i for i, name in enumerate(row)}
                if not all(c in col for c in COLUMNS):
                    col = None
                continue
            # Metric rows are shorter than the header (the rule columns are left off): ask only for the
            # columns read here.
            if col is None or len(row) <= max(col[c] for c in COLUMNS) or not row[col["ID"]].strip():
                continue
            metrics = out.setdefault((path, row[col["ID"]], row[col["Kernel Name"]]), {})
            name = row[col["Metric Name"]].strip()
            if not name:
                continue  # a rule row
            unit = row[col["Metric Unit"]].strip() if "Metric Unit" in col and len(row) > col["Metric Unit"] else ""
            metrics[name] = (row[col["Metric Value"]], unit)
    return out


def summary(metrics):
    """(the line's text after the kernel name, [what is missing]); an empty text when nothing was usable."""
    parts, missing = [], []
    for label, fmt, names in FIELDS:
        name = next((n for n in names if n in metrics), None)
        if name is None:
            missing.append(f"{label} (no {' or '.join(repr(n) for n in names)})")
            continue
        value, unit = metrics[name]
        v = number(value)
        if v is None:
            missing.append(f"{label} ({name!r} is {value!r}, not a number)")
            continue
        if label == "us":
            if unit not in SCALE_TO_US:  # never read a missing or unknown unit as microseconds
                missing.append(f"us ({name} {value} in unit {repr(unit) if unit else 'none'}, "
                               f"not a time unit known here)")
                continue
            v *= SCALE_TO_US[unit]
        parts.append(f"{label} {v:{fmt}}")
    stalls = sorted(((number(v), name[len(STALL):].split("_per_issue_active")[0])
                     for name, (v, _) in metrics.items() if name.startswith(STALL) and number(v) is not None),
                    reverse=True)
    if len(stalls) < STALLS_SHOWN:
        missing.append(f"stalls ({len(stalls)} {STALL}* metrics with a value, {STALLS_SHOWN} needed)")
    if stalls:
        parts.append("stalls " + ", ".join(f"{reason} {v:.2f}" for v, reason in stalls[:STALLS_SHOWN]))
    return "; ".join(parts), missing


def main(paths):
    found = launches(paths)
    errors = []
    for (path, launch, kernel), metrics in found.items():
        text, missing = summary(metrics)
        name = short_name(kernel)
        if not metrics or not text:
            errors.append(f"error: {name} (launch {launch} in {path}): no usable metrics "
                          f"(is the CSV what `ncu --csv --page details` printed?)")
        elif missing:
            errors.append(f"error: {name} (launch {launch} in {path}): missing {'; '.join(missing)}")
        else:
            print(f"{name}: {text}")
    for p in paths:
        if not any(key[0] == p for key in found):
            errors.append(f"error: no ncu launches in {p} (a kernel filter that matched nothing, "
                          f"or not --csv --page details)")
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if len(sys.argv) > 1 else (print(__doc__), 2)[1])
