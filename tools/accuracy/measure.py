"""Measures quantized checkpoints against their source on the held-out text.

  chroot.sh measure.py SOURCE OUT.json QUANTIZED...

SOURCE and each QUANTIZED are checkpoint directories as the chroot sees them
(/mnt/models/NAME, /mnt/work/...). Each is loaded by transformers (the
quantized ones through compressed-tensors, which dequantizes them as
transformers and vLLM read them), cast to float32, and run on the held-out
blocks (common.heldout_blocks). OUT.json gets, per QUANTIZED, whether it
loaded cleanly (missing, unexpected and mismatched keys) and the per-block
sums of kld.FIELDS, from which run.py makes the table and its intervals.
"""
import json
import os
import sys
import time

import torch

import common
import kld


def load(path, quantized):
    """A checkpoint in float32. A quantized one is read through
    compressed-tensors and decompressed (run_compressed=False): its weights
    are then what compressed-tensors dequantizes, in the checkpoint's dtype,
    as vLLM computes with them; the cast to float32 follows."""
    from transformers import AutoModelForCausalLM
    kw = {}
    if quantized:
        from transformers.utils.quantization_config import CompressedTensorsConfig
        kw["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
    model, info = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, device_map="cpu", output_loading_info=True, **kw)
    # Module.float() is refused on a quantized model; _apply casts the same.
    model._apply(lambda t: t.float() if t.is_floating_point() else t)
    model.eval()
    keys = {k: sorted(str(x) for x in info.get(k + "_keys", []))
            for k in ("missing", "unexpected", "mismatched")}
    return model, keys


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__)
    source_dir, out_path, paths = argv[0], argv[1], argv[2:]
    torch.manual_seed(0)
    blocks = common.heldout_blocks()
    source, _ = load(source_dir, False)
    models, results = {}, {}
    for p in paths:
        # A rewritten model with nothing quantized (run.py FUNCTION_ROWS)
        # has no quantization_config: read as a plain checkpoint.
        with open(os.path.join(p, "config.json")) as f:
            quantized = "quantization_config" in json.load(f)
        m, keys = load(p, quantized)
        models[p] = m
        results[p] = {"load": keys}
    t0 = time.time()
    stats = kld.block_stats(source, models, blocks)
    for p in paths:
        results[p]["blocks"] = stats[p].tolist()
        results[p]["summary"] = kld.summary(stats[p])
        print(p, json.dumps(results[p]["summary"]), flush=True)
    common.write_json(out_path, {"source": source_dir, "fields": list(kld.FIELDS),
                                 "seconds": round(time.time() - t0, 1), "results": results})


if __name__ == "__main__":
    main(sys.argv[1:])
