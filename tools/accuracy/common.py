"""What every script of tools/accuracy shares: paths inside the chroot, the
corpus split, the tokenizer and the held-out evaluation blocks.

Runs inside the realref chroot (tools/accuracy/chroot.sh), where the
repository is /mnt/repo (read-only), the models directory /mnt/models, the
work directory /mnt/work and the corpus /mnt/corpus.
"""
import hashlib
import json
import os

import numpy as np

MODELS = "/mnt/models"
WORK = "/mnt/work"
CORPUS = "/mnt/corpus"
DATA = os.path.join(MODELS, "data")
TOKENIZER = os.path.join(DATA, "tokenizer.json")
HELDOUT = os.path.join(DATA, "heldout.u16")
TRAIN_TOKENS = os.path.join(WORK, "train.u16")
CORPUS_MANIFEST = os.path.join(DATA, "corpus.json")

VOCAB_SIZE = 4096
EOS_ID = 0  # "<|endoftext|>", the tokenizer's first special token
# Evaluation, as llama.cpp's llama-perplexity --kl-divergence: blocks of
# CONTEXT tokens, of which the second half is scored (each scored token sees
# at least CONTEXT / 2 tokens before it).
CONTEXT = 512
EVAL_BLOCKS = 128


def corpus_files(root=CORPUS):
    """Every regular .py file under root (no symbolic links: they point
    outside the package), as sorted relative paths."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(d, f)
            if f.endswith(".py") and os.path.isfile(p) and not os.path.islink(p):
                out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def is_heldout(relpath):
    """One file in 16, chosen by a hash of its path, is held out: never
    trained on (the tokenizer neither), the evaluation text."""
    return hashlib.sha256(relpath.encode()).digest()[0] % 16 == 0


def read_text(root, relpath):
    with open(os.path.join(root, relpath), "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def load_tokenizer():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(TOKENIZER)


def heldout_blocks():
    """The evaluation blocks: int64 array [EVAL_BLOCKS, CONTEXT]."""
    ids = np.fromfile(HELDOUT, dtype=np.uint16).astype(np.int64)
    n = EVAL_BLOCKS * CONTEXT
    if ids.size < n:
        raise SystemExit(f"{HELDOUT}: {ids.size} tokens, need {n}")
    return ids[:n].reshape(EVAL_BLOCKS, CONTEXT)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
