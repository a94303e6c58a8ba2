#!/usr/bin/env python3
"""The table of refit's variants in docs/accuracy.md, from the OUT.json
files of variants.py (which runs in the chroot). Standard library only.

  python3 tools/accuracy/variants_table.py SUMMARY.json RUN.json...

Writes SUMMARY.json (every run's figures without the per-block sums) and
prints the markdown table: per variant and model/preset, the KLD and its
paired difference from ctquant's own memoryless_mse output (results.json).
"""
import json
import sys


def table(summary_path, runs):
    """Merges runs (OUT.json of main, as the host sees them) into
    SUMMARY.json (no per-block sums; a variant measured in several runs once:
the runs are deterministic) and prints a markdown table: per
    variant and model/preset, the KLD and its difference from ctquant's
    memoryless_mse with the paired interval."""
    rows, cols, summary = {}, [], {}
    for path in runs:
        with open(path) as f:
            run = json.load(f)
        col = f"{run['model']} {run['preset']}"
        if col not in cols:
            cols.append(col)
        for v, r in run["variants"].items():
            rows.setdefault(v, {})[col] = r
            summary[(run["model"], run["preset"], v)] = {
                "model": run["model"], "preset": run["preset"], "variant": v, "kld": r["kld"],
                "ci": r["ci"], "vs": r["vs"]}
    cols.sort()
    with open(summary_path, "w") as f:
        json.dump([summary[k] for k in sorted(summary)], f, indent=1, sort_keys=True)
        f.write("\n")
    print("| variant | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    first = {"minmax": 0, "mse": 1, "refit": 2}
    for v, per in sorted(rows.items(), key=lambda kv: (first.get(kv[0], 3), kv[0])):
        cells = []
        for c in cols:
            r = per.get(c)
            if r is None:
                cells.append("")
                continue
            d, lo, hi = r["vs"]["ctquant mse"]
            mark = " **lower**" if hi < 0 else (" higher" if lo > 0 else "")
            cells.append(f"{r['kld']:.4f}; {d:+.5f} [{lo:+.5f}, {hi:+.5f}]{mark}")
        print(f"| `{v}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    table(sys.argv[1], sys.argv[2:])
