#!/usr/bin/env python3
# Writes the binary seeds of the fuzz corpus (tests/fuzz/corpus/{safetensors,token_file,checkpoint}) with
# h5py, numpy and struct, so the seeds follow DESIGN.md section 5 and the safetensors specification rather
# than what our own writers produce. Run with /usr/bin/python3 from the repository root; the text seeds
# (json, train_options, tokenizer) are written by hand.
import json
import os
import struct
import zlib

import h5py
import numpy as np

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def out(name, file):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, file)


def safetensors(path, tensors, metadata=None, pad=True):
    header, data = {}, b""
    for name, arr, dtype in tensors:
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


a = np.arange(6, dtype=np.float32).reshape(2, 3)
safetensors(out("safetensors", "f32.safetensors"), [("wte.weight", a, "F32"), ("b", np.float32([1.5]), "F32")],
            {"format": "pt"})
safetensors(out("safetensors", "f16_bf16.safetensors"),
            [("h", np.float16([1, -2, 0.5]), "F16"), ("g", np.uint16([0x3F80, 0xC000]), "BF16")], pad=False)
safetensors(out("safetensors", "scalar_empty.safetensors"),
            [("s", np.float32(3.0), "F32"), ("e", np.zeros((0, 4), np.float32), "F32"), ("i", np.int64([7]), "I64")])


def token_file(path, tokens, dtype, vocab, eot=None, docs=None, crc=False):
    with h5py.File(path, "w") as f:
        t = np.asarray(tokens, dtype=dtype)
        d = f.create_dataset("tokens", data=t, chunks=(max(1, min(len(tokens), 64)),))
        if crc:  # as gpt2-data writes it since 2026-12-07
            d.attrs["crc32"] = np.int64(zlib.crc32(t.astype(t.dtype.newbyteorder("<")).tobytes()))
        f.attrs["vocab_size"] = vocab
        f.attrs["tokenizer"] = "byte" if vocab == 256 else "gpt2"
        f.attrs["format_version"] = 1
        if eot is not None:
            f.attrs["eot_token"] = eot
        if docs is not None:
            f.create_dataset("doc_offsets", data=np.asarray(docs, dtype=np.uint64))


token_file(out("token_file", "u16.h5"), list(b"In the beginning God created"), np.uint16, 256)
token_file(out("token_file", "u32_docs.h5"), [464, 50256, 318, 257, 50256], np.uint32, 50257, eot=50256, docs=[0, 2],
           crc=True)
# Regression seeds of findings: array attributes (read_attr_* wrote past one value); corrupt_chunk_size.h5
# (a chunk stored in 55 of 56 bytes, which libhdf5 over-reads) is the fuzzer's own input, kept as found.
with h5py.File(out("token_file", "array_attributes.h5"), "w") as f:
    f.create_dataset("tokens", data=np.arange(40, dtype=np.uint16), chunks=(16,))
    f.attrs["vocab_size"] = np.array([256, 256, 256], dtype=np.int64)
    f.attrs["tokenizer"] = np.array(["byte", "byte", "byte"], dtype=h5py.string_dtype())
    f.attrs["format_version"] = np.int64(1)

# A checkpoint of the smallest model: L1 H1 C4 V8 maxT4, as written before tensor checksums (tiny.h5) and
# since, with optimizer state and every tensor's crc32 (tiny_opt.h5).
L, C, V, T = 1, 4, 8, 4
shapes = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
for i in range(L):
    p = f"h.{i}."
    shapes.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,), p + "attn.c_attn.weight": (C, 3 * C),
                   p + "attn.c_attn.bias": (3 * C,), p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                   p + "ln_2.weight": (C,), p + "ln_2.bias": (C,), p + "mlp.c_fc.weight": (C, 4 * C),
                   p + "mlp.c_fc.bias": (4 * C,), p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
rng = np.random.default_rng(0)
for with_opt in (False, True):
    with h5py.File(out("checkpoint", "tiny_opt.h5" if with_opt else "tiny.h5"), "w") as f:
        for k, v in {"format_version": 1, "n_layer": L, "n_head": 1, "n_embd": C, "vocab_size": V, "max_seq_len": T,
                     "step": 3, "tokens_seen": 96, "seed": 1337, "data_step": 3, "world_size": 1,
                     "global_batch_tokens": 32, "seq_len": 4}.items():
            f.attrs[k] = np.int64(v)
        def tensor(name, x):
            d = f.create_dataset(name, data=x)
            if with_opt:
                d.attrs["crc32"] = np.int64(zlib.crc32(x.astype("<f4").tobytes()))
        if with_opt:
            f.attrs["tensor_checksum"] = "crc32"
        for name, s in shapes.items():
            tensor("model/" + name, rng.standard_normal(s).astype(np.float32))
        if with_opt:
            for name, s in shapes.items():
                tensor("optimizer/m/" + name, np.zeros(s, np.float32))
                tensor("optimizer/v/" + name, np.zeros(s, np.float32))
            f["optimizer"].attrs["step"] = np.int64(3)
            for k, v in {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0}.items():
                f["optimizer"].attrs[k] = np.float64(v)
