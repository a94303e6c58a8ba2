"""Trains one of the accuracy models, deterministically from its seed.

  chroot.sh train.py NAME [--steps N] [--bench]

NAME is a row of SPECS. The model is a transformers model of a real
architecture (LlamaForCausalLM, Qwen3ForCausalLM), trained in float32 on
WORK/train.u16 (corpus.py) with AdamW and no weight decay, and written in
BF16 to models/NAME/ (config.json, model.safetensors, tokenizer.json,
train.json with the loss curve, the held-out loss and the min-max W4A16
KLD measured along the way by fake quantization).
--bench times a few steps and exits.
"""
import argparse
import json
import math
import os
import shutil
import time

import numpy as np
import torch

import common
import fakequant
import kld

# Every Linear's in_features is a multiple of 128 (group 128 quantizes every
# module). Qwen3 ties its embeddings and normalises q and k per head.
SPECS = {
    "llama-h128": dict(arch="llama", hidden=128, inter=512, layers=4, heads=4, kv_heads=2,
                        steps=2000, batch=16, seq=256, lr=3e-3, seed=1),
    "qwen3-h128": dict(arch="qwen3", hidden=128, inter=512, layers=4, heads=4, kv_heads=2,
                       head_dim=32, steps=2000, batch=16, seq=256, lr=3e-3, seed=2),
    # Wider: rows of two (q/k/v, gate/up) and five (down_proj) groups of 128.
    "llama-h256": dict(arch="llama", hidden=256, inter=640, layers=4, heads=4, kv_heads=2,
                       steps=2000, batch=16, seq=256, lr=3e-3, seed=3),
}


def build(spec):
    common_kw = dict(vocab_size=common.VOCAB_SIZE, hidden_size=spec["hidden"],
                     intermediate_size=spec["inter"], num_hidden_layers=spec["layers"],
                     num_attention_heads=spec["heads"], num_key_value_heads=spec["kv_heads"],
                     max_position_embeddings=common.CONTEXT, rms_norm_eps=1e-6,
                     bos_token_id=common.EOS_ID, eos_token_id=common.EOS_ID,
                     pad_token_id=common.EOS_ID)
    if spec["arch"] == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(tie_word_embeddings=False, **common_kw)
        return LlamaForCausalLM(cfg)
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(tie_word_embeddings=True, head_dim=spec["head_dim"], **common_kw)
    return Qwen3ForCausalLM(cfg)


def lr_at(step, spec):
    warm = max(1, spec["steps"] // 50)
    if step < warm:
        return spec["lr"] * (step + 1) / warm
    t = (step - warm) / max(1, spec["steps"] - warm)
    return spec["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def probe(model, blocks):
    """Held-out loss, and the min-max W4A16 KLD by fake quantization."""
    import copy
    model.eval()
    q = fakequant.quantize_model_(copy.deepcopy(model), fakequant.int_minmax)
    st = kld.block_stats(model, {"w4": q}, blocks)["w4"]
    model.train()
    s = kld.summary(st)
    return {"heldout_loss": math.log(s["ppl_s"]), "w4_kld": s["kld"], "w4_top1": s["top1"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name", choices=sorted(SPECS))
    ap.add_argument("--steps", type=int)
    ap.add_argument("--bench", action="store_true")
    args = ap.parse_args()
    spec = dict(SPECS[args.name])
    if args.steps:
        spec["steps"] = args.steps
    torch.manual_seed(spec["seed"])
    rng = np.random.default_rng(spec["seed"])
    data = torch.from_numpy(np.fromfile(common.TRAIN_TOKENS, dtype=np.uint16).astype(np.int64))
    model = build(spec)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], betas=(0.9, 0.95),
                            weight_decay=0.0)
    probe_blocks = common.heldout_blocks()[:16]
    log, t0, cpu0 = [], time.time(), time.process_time()
    tokens = spec["batch"] * spec["seq"]
    for step in range(spec["steps"]):
        starts = rng.integers(0, data.numel() - spec["seq"] - 1, size=spec["batch"])
        x = torch.stack([data[s:s + spec["seq"] + 1] for s in starts])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, spec)
        loss = torch.nn.functional.cross_entropy(
                model(input_ids=x[:, :-1]).logits.reshape(-1, common.VOCAB_SIZE),
                x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.bench and step == 4:
            t1 = time.time()
        if args.bench and step == 14:
            dt = (time.time() - t1) / 10
            print(f"{args.name}: {n_params} parameters, {tokens / dt:.0f} tokens/s")
            return
        if step % 50 == 0 or step == spec["steps"] - 1:
            row = {"step": step, "loss": float(loss.detach()), "tokens": (step + 1) * tokens,
                   "wall_s": round(time.time() - t0, 1)}
            if step % 250 == 0 or step == spec["steps"] - 1:
                row.update(probe(model, probe_blocks))
            log.append(row)
            print(json.dumps(row), flush=True)
    out = os.path.join(common.MODELS, args.name)
    os.makedirs(out, exist_ok=True)
    model.config.torch_dtype = "bfloat16"
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    shutil.copy(common.TOKENIZER, os.path.join(out, "tokenizer.json"))
    common.write_json(os.path.join(out, "train.json"), {
        "spec": spec, "parameters": n_params, "train_tokens": spec["steps"] * tokens,
        "corpus": json.load(open(common.CORPUS_MANIFEST)),
        "wall_s": round(time.time() - t0, 1), "cpu_s": round(time.process_time() - cpu0, 1),
        "torch": torch.__version__, "log": log,
    })


if __name__ == "__main__":
    main()
