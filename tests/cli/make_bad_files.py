#!/usr/bin/python3
"""Writes token files with h5py (not with our own writer) for the command-line tests:
good.h5 (a valid uint16 byte-level file), good32.h5 (uint32, vocab 300), oob.h5 (a token >= vocab_size),
notokens.h5 (HDF5 without /tokens), vocab_big.h5 (vocab 50257), tiny.h5 (10 tokens), truncated.h5
(the first bytes of good.h5), and notes.h5 (plain text with an .h5 name)."""
import sys

import h5py
import numpy as np

out = sys.argv[1]
rng = np.random.default_rng(0)
text = ("In the beginning God created the heaven and the earth. " * 400).encode()
tokens = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)


def write(name, data, vocab, tokenizer="byte", dtype=None):
    with h5py.File(f"{out}/{name}", "w") as f:
        f.create_dataset("tokens", data=np.asarray(data, dtype=dtype or data.dtype), chunks=True)
        f.attrs["vocab_size"] = vocab
        f.attrs["tokenizer"] = tokenizer
        f.attrs["format_version"] = 1


write("good.h5", tokens, 256)
write("good32.h5", tokens.astype(np.uint32), 300, dtype=np.uint32)
bad = tokens.copy()
bad[5000] = 300  # >= vocab_size 256
write("oob.h5", bad, 256)
write("vocab_big.h5", tokens, 50257, tokenizer="gpt2")
write("tiny.h5", tokens[:10], 256)
with h5py.File(f"{out}/notokens.h5", "w") as f:
    f.create_dataset("something_else", data=np.arange(10))
raw = open(f"{out}/good.h5", "rb").read()
open(f"{out}/truncated.h5", "wb").write(raw[: len(raw) // 3])
open(f"{out}/notes.h5", "w").write("this is not an HDF5 file\n")
