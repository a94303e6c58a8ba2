"""Builds the text the accuracy models are trained and measured on.

  chroot.sh corpus.py

The corpus is the Python standard library's sources as Debian ships them
(/usr/lib/python3.11 on Debian 12, package libpython3.11-stdlib), bound at
/mnt/corpus. One file in 16 (by a hash of its path) is held out. A
byte-level BPE tokenizer of VOCAB_SIZE tokens is trained on the rest. Writes:
  models/data/tokenizer.json  the tokenizer (committed)
  models/data/heldout.u16     the held-out token ids, uint16 (committed)
  models/data/corpus.json     file counts, token counts and SHA-256s (committed)
  WORK/train.u16              the training token ids (not committed: rebuilt)
Each file's tokens are followed by the end-of-text token.
"""
import hashlib
import os

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import common


def main():
    files = common.corpus_files()
    if not files:
        raise SystemExit(f"no .py files under {common.CORPUS}")
    train = [f for f in files if not common.is_heldout(f)]
    held = [f for f in files if common.is_heldout(f)]
    texts = {f: common.read_text(common.CORPUS, f) for f in files}
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.encode() + b"\0" + texts[f].encode() + b"\0")

    os.makedirs(common.DATA, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=common.VOCAB_SIZE, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((texts[f] for f in train), trainer=trainer)
    tok.save(common.TOKENIZER)
    assert tok.token_to_id("<|endoftext|>") == common.EOS_ID

    def encode(names):
        out = []
        for f in names:
            out.extend(tok.encode(texts[f]).ids)
            out.append(common.EOS_ID)
        return np.asarray(out, dtype=np.uint16)

    tr = encode(train)
    he = encode(held)
    tr.tofile(common.TRAIN_TOKENS)
    he.tofile(common.HELDOUT)
    common.write_json(common.CORPUS_MANIFEST, {
        "source": "/usr/lib/python3.11 (Debian 12 libpython3.11-stdlib), *.py",
        "files": len(files), "train_files": len(train), "heldout_files": len(held),
        "text_sha256": digest.hexdigest(),
        "tokenizer_sha256": common.sha256_file(common.TOKENIZER),
        "train_tokens": int(tr.size), "heldout_tokens": int(he.size),
        "train_sha256": common.sha256_file(common.TRAIN_TOKENS),
        "heldout_sha256": common.sha256_file(common.HELDOUT),
        "vocab_size": common.VOCAB_SIZE,
    })
    print(f"corpus: {len(train)} training files, {tr.size} tokens; "
          f"{len(held)} held out, {he.size} tokens")


if __name__ == "__main__":
    main()
