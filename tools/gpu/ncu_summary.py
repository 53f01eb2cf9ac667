#!/usr/bin/env python3
"""Per kernel, what an ncu --csv --page details log says holds it back, in one line each.

  ncu_summary.py LOG [LOG ...]

LOG is what `ncu --csv --page details ...` printed (the application's own output and ncu's ==PROF== lines
mixed in are skipped). For each profiled launch: its duration, the SM and memory throughput (% of peak),
the issue slots used, the warps eligible per scheduler and cycle, achieved occupancy, and the three warp
stall reasons with the most cycles per issued instruction (the smsp__average_warps_issue_stalled_*
metrics, when the run asked for them). A LOG without a profiled launch (a kernel filter that matched
nothing) is named, and the exit status is then 1. Phase C's ncu_attention step prints it;
docs/performance.md says how to read it. Standard library only: the device's Python runs it.
"""
import csv
import sys

STALL = "smsp__average_warps_issue_stalled_"
# (label, metric names as the sections print them or as --metrics names them)
FIELDS = [
    ("us", ("Duration",)),
    ("sm%", ("Compute (SM) Throughput",)),
    ("mem%", ("Memory Throughput",)),
    ("issue%", ("Issue Slots Busy", "smsp__issue_active.avg.pct_of_peak_sustained_active")),
    ("eligible", ("Eligible Warps Per Scheduler", "smsp__warps_eligible.avg.per_cycle_active")),
    ("occupancy%", ("Achieved Occupancy",)),
    ("regs", ("Registers Per Thread",)),
]
SCALE_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def short_name(kernel):
    """'void ns::(anonymous namespace)::attention_bwd_tc<64>(...)' -> 'attention_bwd_tc<64>'."""
    head = kernel.replace("(anonymous namespace)::", "").split("(", 1)[0].split()
    return head[-1].split("::")[-1] if head else kernel


def launches(paths):
    """{(launch id, kernel): {metric name: (value, unit)}} in the order the logs give them."""
    out = {}
    for path in paths:
        with open(path, errors="replace") as f:
            lines = [l for l in f if l.startswith('"')]
        header = None
        for row in csv.reader(lines):
            if "Metric Name" in row and "Kernel Name" in row:
                header = {name: i for i, name in enumerate(row)}
                continue
            if header is None or len(row) < len(header):
                continue
            key = (path, row[header["ID"]], row[header["Kernel Name"]])
            unit = row[header["Metric Unit"]] if "Metric Unit" in header else ""
            out.setdefault(key, {})[row[header["Metric Name"]]] = (row[header["Metric Value"]], unit)
    return out


def summary(key, metrics):
    parts = []
    for label, names in FIELDS:
        for name in names:
            if name in metrics:
                value, unit = metrics[name]
                v = number(value)
                if v is None:
                    break
                if label == "us" and unit not in SCALE_TO_US:
                    parts.append(f"duration {v:.1f} {unit or '(no unit)'}")
                    break
                if label == "us":
                    v *= SCALE_TO_US[unit]
                parts.append(f"{label} {v:.1f}" if label != "regs" else f"{label} {v:.0f}")
                break
    stalls = sorted(((number(v), name[len(STALL):].split("_per_issue_active")[0])
                     for name, (v, _) in metrics.items() if name.startswith(STALL) and number(v) is not None),
                    reverse=True)
    if stalls:
        parts.append("stalls " + ", ".join(f"{reason} {v:.2f}" for v, reason in stalls[:3]))
    return f"{short_name(key[2])}: " + ("; ".join(parts) if parts else "no metrics")


def main(paths):
    found = launches(paths)
    for key, metrics in found.items():
        print(summary(key, metrics))
    missing = [p for p in paths if not any(key[0] == p for key in found)]
    for p in missing:
        print(f"{p}: no ncu launches (a kernel filter that matched nothing, or not --csv --page details)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if len(sys.argv) > 1 else (print(__doc__), 2)[1])
