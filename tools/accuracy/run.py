#!/usr/bin/env python3
"""The accuracy measure of ctquant's methods (docs/accuracy.md), on the host.

  python3 tools/accuracy/run.py table [--model NAME]... [--rows SET]
  python3 tools/accuracy/run.py check
  python3 tools/accuracy/run.py rows
  python3 tools/accuracy/run.py doc

`table` quantizes every model of tools/accuracy/models with every row of
ROWS (ctquant, on the host), measures each output against its source in the
realref chroot (measure.py: transformers + compressed-tensors load it as
vLLM reads it), and writes tools/accuracy/results.json and the tables of
docs/accuracy.md. `check` (CI) measures the PINNED rows again and fails when
a KLD moved from results.json by more than the tolerance. `rows` lists the
rows; `doc` rewrites the tables from results.json alone. Needs root (the
chroot) and the built tool (CTQUANT, default build/ctquant). Standard
library only.
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODELS = os.path.join(HERE, "models")
RESULTS = os.path.join(HERE, "results.json")
DOC = os.path.join(REPO, "docs", "accuracy.md")
WORK = os.environ.get("CTQUANT_ACCURACY_WORK", "/tmp/ctquant-accuracy")
CTQUANT = os.environ.get("CTQUANT", os.path.join(REPO, "build", "ctquant"))


def int_config(bits, symmetric, group=128):
    return {"config_groups": {"group_0": {
        "targets": ["Linear"], "format": "pack-quantized",
        "weights": {"num_bits": bits, "type": "int", "symmetric": symmetric,
                    "strategy": "group", "group_size": group, "dynamic": False}}}}


LOW_BITS = ["--allow", "L10"]


# A row: (id, preset label, method label, ctquant arguments or a config).
# The preset label groups rows in the tables; min-max is each preset's
# baseline, and every other row of the preset is compared with it pairwise.
ROWS = [
    ("w4a16-minmax", "W4A16", "min-max", ["--scheme", "W4A16"]),
    ("w4a16-mse", "W4A16", "memoryless_mse", ["--scheme", "W4A16", "--observer", "memoryless_mse"]),
    ("w4a16-refit", "W4A16", "refit", ["--scheme", "W4A16", "--observer", "refit"]),
    ("w4a16-auto", "W4A16", "auto", ["--scheme", "W4A16", "--observer", "auto"]),
    ("w4a16-tb4.5", "W4A16", "--target-bits 4.5", ["--scheme", "W4A16", "--target-bits", "4.5"]),
    ("w4a16-tb5", "W4A16", "--target-bits 5", ["--scheme", "W4A16", "--target-bits", "5"]),
    ("w4a16-tb6", "W4A16", "--target-bits 6", ["--scheme", "W4A16", "--target-bits", "6"]),
    ("w4a16-morebits", "W4A16", "--more-bits layers", ["--scheme", "W4A16", "--more-bits", "layers"]),
    # --target-bits at the bits per weight --more-bits layers reached (its
    # row runs first; the value is rounded down to 4 decimals).
    ("w4a16-tb-morebits", "W4A16", "--target-bits (as --more-bits)",
     ["--scheme", "W4A16", "--target-bits", "{bpw:w4a16-morebits}"]),
    # --transform balance (docs/accuracy.md, "Rewrites before quantizing"):
    # the torch prototype's balance-nncf, now ctquant's output.
    ("w4a16-balance", "W4A16", "--transform balance", ["--scheme", "W4A16", "--transform", "balance"]),
    ("w4a16-refit-balance", "W4A16", "refit + --transform balance",
     ["--scheme", "W4A16", "--observer", "refit", "--transform", "balance"]),
    # --transform rotate (offline Hadamard R1 + R2): ctquant's output.
    ("w4a16-rotate", "W4A16", "--transform rotate", ["--scheme", "W4A16", "--transform", "rotate"]),
    ("w4a16-mse-rotate", "W4A16", "memoryless_mse + --transform rotate",
     ["--scheme", "W4A16", "--observer", "memoryless_mse", "--transform", "rotate"]),
    ("w4a16asym-minmax", "W4A16_ASYM", "min-max", ["--scheme", "W4A16_ASYM"]),
    ("w4a16asym-mse", "W4A16_ASYM", "memoryless_mse",
     ["--scheme", "W4A16_ASYM", "--observer", "memoryless_mse"]),
    ("w4a16asym-refit", "W4A16_ASYM", "refit", ["--scheme", "W4A16_ASYM", "--observer", "refit"]),
    ("w4a16asym-auto", "W4A16_ASYM", "auto", ["--scheme", "W4A16_ASYM", "--observer", "auto"]),
    ("w8a16-minmax", "W8A16", "min-max", ["--scheme", "W8A16"]),
    ("w8a16-mse", "W8A16", "memoryless_mse", ["--scheme", "W8A16", "--observer", "memoryless_mse"]),
    ("w8a16-refit", "W8A16", "refit", ["--scheme", "W8A16", "--observer", "refit"]),
    ("nvfp4a16-minmax", "NVFP4A16", "min-max", ["--scheme", "NVFP4A16"]),
    ("nvfp4a16-mse", "NVFP4A16", "memoryless_mse",
     ["--scheme", "NVFP4A16", "--observer", "memoryless_mse"]),
    ("nvfp4a16-expmse", "NVFP4A16", "nvfp4_expanded_mse",
     ["--scheme", "NVFP4A16", "--observer", "nvfp4_expanded_mse"]),
    ("nvfp4a16-refit", "NVFP4A16", "refit", ["--scheme", "NVFP4A16", "--observer", "refit"]),
    ("mxfp4a16-minmax", "MXFP4A16", "min-max", ["--scheme", "MXFP4A16"]),
    ("mxfp4a16-mse", "MXFP4A16", "memoryless_mse",
     ["--scheme", "MXFP4A16", "--observer", "memoryless_mse"]),
    ("mxfp4a16-refit", "MXFP4A16", "refit", ["--scheme", "MXFP4A16", "--observer", "refit"]),
    ("mxfp4a16-rotate", "MXFP4A16", "--transform rotate",
     ["--scheme", "MXFP4A16", "--transform", "rotate"]),
    # vLLM's Marlin runs 4 and 8 bits only (lint L10): --allow-unloadable
    # writes them for compressed-tensors and transformers, which read them.
    ("w3-minmax", "W3 g128", "min-max", int_config(3, True), LOW_BITS),
    ("w3-mse", "W3 g128", "memoryless_mse", int_config(3, True),
     LOW_BITS + ["--observer", "memoryless_mse"]),
    ("w3-refit", "W3 g128", "refit", int_config(3, True), LOW_BITS + ["--observer", "refit"]),
    ("w3-rotate", "W3 g128", "--transform rotate", int_config(3, True),
     LOW_BITS + ["--transform", "rotate"]),
    ("w3asym-minmax", "W3_ASYM g128", "min-max", int_config(3, False), LOW_BITS),
    ("w3asym-mse", "W3_ASYM g128", "memoryless_mse", int_config(3, False),
     LOW_BITS + ["--observer", "memoryless_mse"]),
    ("w3asym-refit", "W3_ASYM g128", "refit", int_config(3, False),
     LOW_BITS + ["--observer", "refit"]),
    ("w2asym-minmax", "W2_ASYM g128", "min-max", int_config(2, False), LOW_BITS),
    ("w2asym-mse", "W2_ASYM g128", "memoryless_mse", int_config(2, False),
     LOW_BITS + ["--observer", "memoryless_mse"]),
    ("w2asym-refit", "W2_ASYM g128", "refit", int_config(2, False),
     LOW_BITS + ["--observer", "refit"]),
    # Function kept: the rewritten model with nothing quantized (every
    # module ignored; --allow-unloadable writes it), measured once its
    # empty quantization_config is dropped (FUNCTION_ROWS): ctquant's
    # rewritten BF16 weights against the source.
    ("bf16-rotate", "BF16 (no quantization)", "--transform rotate",
     ["--transform", "rotate", "--ignore", "re:.*", "--allow-unloadable"]),
    ("bf16-balance", "BF16 (no quantization)", "--transform balance",
     ["--transform", "balance", "--ignore", "re:.*", "--allow-unloadable"]),
]
FUNCTION_ROWS = {"bf16-rotate", "bf16-balance"}
# The comparisons docs/accuracy.md states for every model: (row, against).
COMPARE = [
    ("w4a16-refit", "w4a16-minmax"), ("w4a16-refit", "w4a16-mse"),
    ("w4a16asym-refit", "w4a16asym-minmax"), ("w4a16asym-refit", "w4a16asym-mse"),
    ("w3-refit", "w3-minmax"), ("w3-refit", "w3-mse"),
    ("w3asym-refit", "w3asym-minmax"), ("w3asym-refit", "w3asym-mse"),
    ("w4a16-tb5", "w4a16-minmax"), ("w4a16-tb-morebits", "w4a16-morebits"),
    ("w4a16-refit-balance", "w4a16-refit"),
    ("w4a16-rotate", "w4a16-minmax"), ("w4a16-mse-rotate", "w4a16-mse"),
    ("mxfp4a16-rotate", "mxfp4a16-minmax"), ("w3-rotate", "w3-minmax"),
]
# What `check` measures again in CI, and how far a KLD may move (relative).
PINNED = ["w4a16-minmax", "w4a16-mse", "w3asym-minmax"]
TOLERANCE = 0.02


def row_args(row, work):
    """ctquant quantize arguments of a row (a config is written into work)."""
    rest = list(row[4]) if len(row) > 4 else []
    if isinstance(row[3], dict):
        path = os.path.join(work, row[0] + ".json")
        with open(path, "w") as f:
            json.dump(row[3], f)
        return ["--quantization-config", path] + rest
    return list(row[3]) + rest


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def bits_per_weight(out_dir):
    """(bits per weight of the quantized modules, their parameters, bytes of
    every .safetensors file). A quantized module is one with a weight_scale;
    its bits are those of every tensor it writes but weight_shape."""
    tensors = {}
    total = 0
    for f in sorted(os.listdir(out_dir)):
        if f.endswith(".safetensors"):
            total += os.path.getsize(os.path.join(out_dir, f))
            tensors.update({k: v for k, v in read_header(os.path.join(out_dir, f)).items()
                            if k != "__metadata__"})
    bits = params = 0
    for name, t in tensors.items():
        if not name.endswith(".weight_scale"):
            continue
        mod = name[:-len(".weight_scale")]
        shape = tensors.get(mod + ".weight_shape")
        if shape is not None:
            sh = read_int_tensor(out_dir, mod + ".weight_shape", tensors)
            params += sh[0] * sh[1]
        elif mod + ".weight" in tensors:
            params += math.prod(tensors[mod + ".weight"]["shape"])
        else:  # FP4 codes, two per byte, and no weight_shape (NVFP4, MXFP4)
            packed = tensors[mod + ".weight_packed"]
            assert packed["dtype"] == "U8", (mod, packed["dtype"])
            params += 2 * math.prod(packed["shape"])
        for k, v in tensors.items():
            if k.startswith(mod + ".") and k.count(".") == mod.count(".") + 1 and \
                    not k.endswith(".weight_shape"):
                bits += 8 * (v["data_offsets"][1] - v["data_offsets"][0])
    return bits / params, params, total


def read_int_tensor(out_dir, name, tensors):
    for f in sorted(os.listdir(out_dir)):
        if not f.endswith(".safetensors"):
            continue
        path = os.path.join(out_dir, f)
        h = read_header(path)
        if name in h:
            with open(path, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                a, b = h[name]["data_offsets"]
                fh.seek(8 + n + a)
                raw = fh.read(b - a)
            fmt = {"I64": "q", "I32": "i"}[h[name]["dtype"]]
            return list(struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw))
    raise KeyError(name)


def substitute(args, done):
    """Replaces "{bpw:ROW}" by the bits per weight ROW reached (rounded down
    to 4 decimals); done maps row ids to their quantize() info."""
    out = []
    for a in args:
        if a.startswith("{bpw:") and a.endswith("}"):
            bpw = done[a[5:-1]]["bits_per_weight"]
            a = f"{math.floor(bpw * 1e4) / 1e4:.4f}"
        out.append(a)
    return out


def quantize(model, row, work, done=None):
    out = os.path.join(work, model, row[0])
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = [CTQUANT, "quantize", os.path.join(MODELS, model), out, "-q", "--no-sync",
           "--threads", "1"] + substitute(row_args(row, work), done or {})
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dt = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"run.py: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    if row[0] in FUNCTION_ROWS:
        # Nothing quantized: the model as rewritten, read as a plain one.
        path = os.path.join(out, "config.json")
        with open(path) as f:
            config = json.load(f)
        config.pop("quantization_config", None)
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)
                   if f.endswith(".safetensors"))
        return out, {"seconds": round(dt, 3), "bits_per_weight": 16.0, "quantized_params": 0,
                     "safetensors_bytes": size, "command": cmd[1:]}
    bpw, params, size = bits_per_weight(out)
    return out, {"seconds": round(dt, 3), "bits_per_weight": bpw, "quantized_params": params,
                 "safetensors_bytes": size, "command": cmd[1:]}


def measure(model, outs, work):
    """Runs measure.py in the chroot; returns {row id: result}."""
    res = os.path.join(work, model, "measure.json")
    inside = lambda p: "/mnt/work/" + os.path.relpath(p, work)
    cmd = ["bash", os.path.join(HERE, "chroot.sh"), "measure.py", "/mnt/models/" + model,
           inside(res)] + [inside(o) for o in outs.values()]
    env = dict(os.environ, CTQUANT_ACCURACY_WORK=work)
    subprocess.run(cmd, check=True, env=env)
    with open(res) as f:
        data = json.load(f)
    return {rid: data["results"][inside(o)] for rid, o in outs.items()}


FIELDS = ("kl", "tv", "top1", "nll_s", "nll_q", "n")


def mean(blocks, field, idx=None):
    idx = range(len(blocks)) if idx is None else idx
    return sum(blocks[i][field] for i in idx) / sum(blocks[i][5] for i in idx)


def bootstrap(a, b=None, field=0, reps=2000, seed=0):
    """95% interval of a per-token mean over a bootstrap of blocks, or of
    the paired difference a - b (the same resampled blocks for both)."""
    rnd = random.Random(seed)
    n = len(a)
    vals = []
    for _ in range(reps):
        idx = [rnd.randrange(n) for _ in range(n)]
        v = mean(a, field, idx)
        if b is not None:
            v -= mean(b, field, idx)
        vals.append(v)
    vals.sort()
    return vals[int(0.025 * reps)], vals[int(0.975 * reps) - 1]


def list_models():
    return sorted(d for d in os.listdir(MODELS)
                  if os.path.isfile(os.path.join(MODELS, d, "model.safetensors")))


def cmd_table(args):
    models = args.model or list_models()
    rows = [r for r in ROWS if not args.rows or r[0] in args.rows.split(",")]
    os.makedirs(WORK, exist_ok=True)
    results = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            results = json.load(f)
    for m in models:
        outs, info = {}, {}
        for r in rows:
            print(f"run.py: {m}: {r[0]}", file=sys.stderr, flush=True)
            done = dict(results.get("models", {}).get(m, {}), **info)
            outs[r[0]], info[r[0]] = quantize(m, r, WORK, done)
        meas = measure(m, outs, WORK)
        per = results.setdefault("models", {}).setdefault(m, {})
        for r in rows:
            per[r[0]] = dict(info[r[0]], preset=r[1], method=r[2], **meas[r[0]])
    results["tolerance"] = TOLERANCE
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
        f.write("\n")
    write_doc(results)


def fk(x):
    """A KLD or a difference of KLDs: 4 decimals, or 3 significant digits
    below 0.001 (W8A16's are about 1e-4)."""
    return f"{x:.4f}" if abs(x) >= 1e-3 or x == 0 else f"{x:.3g}"


def fmt_ci(lo, hi):
    return f"[{fk(lo)}, {fk(hi)}]"


def model_table(name, per):
    lines = []
    with open(os.path.join(MODELS, name, "train.json")) as f:
        tr = json.load(f)
    sp = tr["spec"]
    first = next(iter(per.values()))["summary"]
    lines.append(f"### {name}\n")
    lines.append(f"{sp['arch']}, {sp['layers']} layers, hidden {sp['hidden']}, intermediate "
                 f"{sp['inter']}, {tr['parameters']:,} parameters, trained on "
                 f"{tr['train_tokens']:,} tokens; held-out perplexity {first['ppl_s']:.3f}.\n")
    lines.append("| preset | method | bits/weight | KLD [95% CI] | vs min-max: ΔKLD [95% CI] | "
                 "same top-1 | ΔPPL | 1 − TV | loads | quantize s |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    base = {}
    for rid, r in per.items():
        if r["method"] == "min-max":
            base[r["preset"]] = r
    order = {row[0]: i for i, row in enumerate(ROWS)}
    ids = sorted(per, key=lambda rid: (order.get(rid, len(order)), rid))
    for rid in ids:
        r = per[rid]
        s = r["summary"]
        lo, hi = bootstrap(r["blocks"])
        b = base.get(r["preset"])
        if b is not None and b is not r:
            dlo, dhi = bootstrap(r["blocks"], b["blocks"])
            d = s["kld"] - b["summary"]["kld"]
            verdict = " (better)" if dhi < 0 else (" (worse)" if dlo > 0 else "")
            diff = f"{'+' if d >= 0 else ''}{fk(d)} {fmt_ci(dlo, dhi)}{verdict}"
        elif b is None:
            diff = "-"
        else:
            diff = "baseline"
        ld = r["load"]
        clean = not ld["missing"] and not ld["unexpected"] and not ld["mismatched"]
        lines.append(
            f"| {r['preset']} | {r['method']} | {r['bits_per_weight']:.3f} | "
            f"{fk(s['kld'])} {fmt_ci(lo, hi)} | {diff} | {100 * s['top1']:.2f}% | "
            f"{s['ppl_q'] - s['ppl_s']:+.4f} | {100 * (1 - s['tv']):.2f}% | "
            f"{'yes' if clean else 'NO'} | {r['seconds']:.2f} |")
    lines.append("")
    lines.append(best_lines(per, ids))
    lines.append(compare_lines(per))
    return "\n".join(lines) + "\n"


def compare_lines(per):
    """The paired comparisons of COMPARE that both rows of were measured."""
    out = ["| row | against | bits/weight | ΔKLD [95% CI] | verdict |", "|---|---|---|---|---|"]
    for a, b in COMPARE:
        if a not in per or b not in per:
            continue
        ra, rb = per[a], per[b]
        lo, hi = bootstrap(ra["blocks"], rb["blocks"])
        d = ra["summary"]["kld"] - rb["summary"]["kld"]
        verdict = "lower" if hi < 0 else ("higher" if lo > 0 else "tied")
        out.append(f"| {ra['preset']} {ra['method']} | {rb['preset']} {rb['method']} | "
                   f"{ra['bits_per_weight']:.3f} vs {rb['bits_per_weight']:.3f} | "
                   f"{'+' if d >= 0 else ''}{fk(d)} {fmt_ci(lo, hi)} | {verdict} |")
    return "Paired comparisons:\n\n" + "\n".join(out) + "\n" if len(out) > 2 else ""


def best_lines(per, ids):
    """Names the lowest KLD of each preset, and whether the paired interval
    against the runner-up excludes zero."""
    presets = []
    for rid in ids:
        if per[rid]["preset"] not in presets:
            presets.append(per[rid]["preset"])
    out = []
    # Function rows (nothing quantized) are not a method to choose.
    presets = [p for p in presets
               if not any(per[rid]["preset"] == p and rid in FUNCTION_ROWS for rid in ids)]
    for p in presets:
        # At the preset's own size: rows that spend more bits compete apart.
        size = min(per[rid]["bits_per_weight"] for rid in ids if per[rid]["preset"] == p)
        rows = sorted((rid for rid in ids if per[rid]["preset"] == p and
                       abs(per[rid]["bits_per_weight"] - size) < 1e-9),
                      key=lambda rid: per[rid]["summary"]["kld"])
        best = per[rows[0]]
        if len(rows) == 1:
            continue
        same = [per[rid]["method"] for rid in rows[1:] if per[rid]["blocks"] == best["blocks"]]
        rest = [rid for rid in rows[1:] if per[rid]["blocks"] != best["blocks"]]
        line = f"- {p}: lowest KLD with {best['method']} ({fk(best['summary']['kld'])})"
        if same:
            line += f", the same figures as {', '.join(same)}"
        if rest:
            second = per[rest[0]]
            lo, hi = bootstrap(best["blocks"], second["blocks"])
            sure = "better than" if hi < 0 else "tied with"
            line += f"; {sure} {second['method']} (paired difference {fmt_ci(lo, hi)})"
        out.append(line)
    return "Best per preset at its own bits per weight:\n\n" + "\n".join(out) + "\n"


BEGIN = "<!-- accuracy tables: written by tools/accuracy/run.py table -->"
END = "<!-- end of accuracy tables -->"


def write_doc(results):
    tables = "\n".join(model_table(m, per) for m, per in sorted(results["models"].items()))
    with open(DOC) as f:
        text = f.read()
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    with open(DOC, "w") as f:
        f.write(text[:a] + "\n\n" + tables + "\n" + text[b:])


def cmd_check(args):
    with open(RESULTS) as f:
        results = json.load(f)
    rows = [r for r in ROWS if r[0] in PINNED]
    bad = []
    work = tempfile.mkdtemp(prefix="ctquant-accuracy-check-")
    for m in sorted(results["models"]):
        outs = {r[0]: quantize(m, r, work, results["models"][m])[0] for r in rows}
        meas = measure(m, outs, work)
        for rid in outs:
            want = results["models"][m][rid]["summary"]["kld"]
            got = meas[rid]["summary"]["kld"]
            rel = abs(got - want) / want
            ok = rel <= TOLERANCE
            print(f"{m} {rid}: KLD {got:.6f}, table {want:.6f} ({rel:+.2%}) "
                  f"{'ok' if ok else 'MOVED'}")
            if not ok:
                bad.append(f"{m} {rid}")
    shutil.rmtree(work)
    if bad:
        raise SystemExit(f"run.py check: KLD moved beyond {TOLERANCE:.0%}: {', '.join(bad)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table")
    t.add_argument("--model", action="append")
    t.add_argument("--rows", help="comma-separated row ids (default: all)")
    sub.add_parser("check")
    sub.add_parser("rows")
    sub.add_parser("doc")
    args = ap.parse_args()
    if args.cmd == "table":
        cmd_table(args)
    elif args.cmd == "check":
        cmd_check(args)
    elif args.cmd == "doc":
        with open(RESULTS) as f:
            write_doc(json.load(f))
    else:
        for r in ROWS:
            print(r[0], r[1], r[2], sep="\t")


if __name__ == "__main__":
    main()
