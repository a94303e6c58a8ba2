"""The measure: a model against its source on the held-out blocks, as
llama.cpp's llama-perplexity --kl-divergence reports it.

Per block (common.CONTEXT tokens, the second half scored) it keeps the sums
the statistics are made of, so that any two models measured on the same
blocks can be compared pairwise (paired bootstrap over blocks):
  kl     sum over scored tokens of KL(source || model), nats
  tv     sum of the total-variation distance 0.5 * sum |p - q|
  top1   tokens whose argmax agrees
  nll_s, nll_q  sums of -log p(next token) under source and model
  n      scored tokens
"""
import numpy as np
import torch

import common

FIELDS = ("kl", "tv", "top1", "nll_s", "nll_q", "n")


@torch.no_grad()
def block_stats(source, models, blocks, batch=8):
    """Returns {name: np.array [n_blocks, len(FIELDS)]} for each model of
    models ({name: module}); blocks is int64 [n_blocks, CONTEXT]."""
    half = blocks.shape[1] // 2
    out = {k: np.zeros((blocks.shape[0], len(FIELDS))) for k in models}
    for b0 in range(0, blocks.shape[0], batch):
        ids = torch.from_numpy(blocks[b0:b0 + batch])
        tgt = ids[:, half + 1:]
        ls = torch.log_softmax(source(ids).logits[:, half:-1].double(), -1)
        ps = ls.exp()
        nll_s = -ls.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        top_s = ls.argmax(-1)
        for k, m in models.items():
            lq = torch.log_softmax(m(ids).logits[:, half:-1].double(), -1)
            kl = (ps * (ls - lq)).sum(-1)
            tv = 0.5 * (ps - lq.exp()).abs().sum(-1)
            nll_q = -lq.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            top = (lq.argmax(-1) == top_s).double()
            stats = torch.stack([kl.sum(-1), tv.sum(-1), top.sum(-1), nll_s.sum(-1),
                                 nll_q.sum(-1), torch.full_like(kl[:, 0], kl.shape[1])], -1)
            out[k][b0:b0 + ids.shape[0]] = stats.numpy()
    return out


def summary(stats):
    """Point estimates from the block sums."""
    s = stats.sum(0)
    n = s[5]
    return {"kld": s[0] / n, "tv": s[1] / n, "top1": s[2] / n,
            "ppl_s": float(np.exp(s[3] / n)), "ppl_q": float(np.exp(s[4] / n))}


def bootstrap(stats_a, stats_b=None, field=0, reps=2000, seed=0):
    """95% interval of the mean of a per-token field (default KL) over a
    bootstrap of blocks, or of the paired difference a - b when stats_b is
    given (the same resampled blocks for both)."""
    rng = np.random.default_rng(seed)
    nb = stats_a.shape[0]
    idx = rng.integers(0, nb, size=(reps, nb))
    def mean(st):
        return st[idx, field].sum(1) / st[idx, 5].sum(1)
    v = mean(stats_a) if stats_b is None else mean(stats_a) - mean(stats_b)
    return float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))
