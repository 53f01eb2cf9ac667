#!/usr/bin/python3
"""Hugging Face interop tests (issue 6): gpt2-data export-hf and gpt2-train --init-from FILE.safetensors.

Nothing here uses our own safetensors code to judge our safetensors code: files are parsed and written
by hand with numpy (the format is 8 bytes of little-endian header length, a JSON header, raw data), and
logits are recomputed by the plain-torch GPT-2 of tests/oracle/torch_gpt2.py in fp64.

usage: /usr/bin/python3 test_hf.py CASE BIN_DIR HF_LOGITS WORK_DIR
  CASE: setup      trains a tiny model (vocab 300: wte has padding rows) and one with GPT-2's vocabulary
                   50257, and exports both (the other cases need it: a CTest fixture)
        roundtrip  model.safetensors parsed by hand: names, shapes, dtype, offsets, metadata, values equal
                   to the HDF5 checkpoint's; config.json keys and values; torch logits == our logits
        init_from  --init-from model.safetensors gives the same eval loss as --init-from the checkpoint;
                   training from it runs; model mismatches name the file's dimensions
        dtypes     F16 and BF16 files with the "transformer." prefix and the buffers of released files;
                   every 16-bit pattern converts exactly
        bad_inputs truncated, bad header length, bad JSON, wrong shape, missing tensor, unknown dtype, ...
                   each a clear error and a non-zero exit within a timeout, on 1 and 2 ranks
        json       the JSON parser of headers and config.json against Python's json module (no fixture)
Exit status 0 when every check passes.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import sys

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:  # in CI a missing oracle is a failure, never a skip
    print(f"FAIL: test_hf.py needs numpy, h5py and torch for /usr/bin/python3 ({e}); "
          "apt-get install python3-torch python3-h5py python3-numpy", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
import torch_gpt2  # noqa: E402  (the plain-torch GPT-2 of the PyTorch oracle; sets fp64 as default dtype)

CASE, BIN, HF_LOGITS, WORK = sys.argv[1:5]
TMP = f"{WORK}/case_{CASE}"  # this case's own files: the cases may run in parallel (ctest -j)
TRAIN = os.path.join(BIN, "gpt2-train")
DATA = os.path.join(BIN, "gpt2-data")

# The small model: awkward sizes (head size 16, 3 heads), vocab 300 so wte has 84 padding rows.
SMALL = {"n_layer": 2, "n_head": 3, "n_embd": 48, "vocab_size": 300, "max_seq_len": 40}
# GPT-2's vocabulary (padded to 50304 inside): bos/eos 50256 in config.json.
BIG = {"n_layer": 1, "n_head": 1, "n_embd": 64, "vocab_size": 50257, "max_seq_len": 24}  # the preset d1
LOGITS_TOL = 1e-5  # ||ours - torch|| / ||torch||: fp32 against fp64, as the PyTorch oracle

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def model_args(m):
    return ["--n-layer", str(m["n_layer"]), "--n-head", str(m["n_head"]), "--n-embd", str(m["n_embd"]),
            "--vocab-size", str(m["vocab_size"]), "--max-seq-len", str(m["max_seq_len"])]


def run(cmd, timeout=120):
    """Runs cmd; returns (exit status, stdout+stderr). A timeout is status 124 (a hang)."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode(errors="replace")


def run_ok(cmd, what, timeout=120):
    rc, out = run(cmd, timeout)
    if not check(rc == 0, f"{what} (exit {rc})"):
        print("\n".join(out.splitlines()[-8:]))
    return out


def train_cmd(m, *extra):
    return [TRAIN, "--device", "cpu", "--threads", "2", *model_args(m), "--seq-len", "16", "--micro-batch", "4",
            "--val-data", f"{WORK}/val.h5", "--val-batches", "4", *extra]


def eval_loss(m, init_from, name, *extra):
    out_dir = f"{TMP}/eval_{name}"
    shutil.rmtree(out_dir, ignore_errors=True)
    out = run_ok(train_cmd(m, "--eval-only", "--init-from", init_from, "--out", out_dir, *extra), f"eval-only {name}")
    try:
        with open(f"{out_dir}/metrics.jsonl") as f:
            return [json.loads(l)["val_loss"] for l in f if "val_loss" in l][-1], out
    except (OSError, IndexError, KeyError):
        return float("nan"), out


# ---- safetensors by hand ---------------------------------------------------------------------------

SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4}


def read_st(path):
    """(header dict, {name: fp32 array}) of a safetensors file, by hand."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    arrays = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        buf = data[b:e]
        if t["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        elif t["dtype"] == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            continue
        arrays[name] = a.reshape(t["shape"])
    return n, header, data, arrays


def to_bf16_bits(a):
    """fp32 -> bf16 bit patterns, round to nearest even (as torch does)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def write_st(path, tensors, metadata=None, header_edit=None, raw_edit=None):
    """Writes a safetensors file by hand. tensors: list of (name, dtype, shape, raw bytes) in data order.
    header_edit(header dict) may change the header before it is written; raw_edit(bytes) the whole file."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    if header_edit:
        header_edit(header)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    raw = struct.pack("<Q", len(h)) + h + b"".join(blobs)
    if raw_edit:
        raw = raw_edit(raw)
    with open(path, "wb") as f:
        f.write(raw)


def encode(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    if dtype == "BF16":
        return to_bf16_bits(a).astype("<u2").tobytes()
    raise ValueError(dtype)


def decoded(a, dtype):
    """The fp32 values a reader must get back from encode(a, dtype)."""
    if dtype == "F32":
        return np.asarray(a, np.float32)
    if dtype == "F16":
        return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)
    return (to_bf16_bits(a).astype(np.uint32) << 16).view(np.float32).reshape(np.shape(a))


# ---- logits --------------------------------------------------------------------------------------

def tokens_for(m, B=3):
    rng = np.random.default_rng(7)
    tok = rng.integers(0, m["vocab_size"], size=(B, m["max_seq_len"]), dtype=np.int32)
    path = f"{TMP}/tokens_{m['vocab_size']}.i32"
    tok.tofile(path)
    return tok, path


def our_logits(model_path, m, tok, tok_path, name, n_head=None):
    B, T = tok.shape
    out = f"{TMP}/logits_{name}.f32"
    cmd = [HF_LOGITS, "logits", model_path, tok_path, str(B), str(T), out] + ([str(n_head)] if n_head else [])
    run_ok(cmd, f"hf_logits {name}")
    if not os.path.exists(out):
        return None
    return np.fromfile(out, dtype=np.float32).reshape(B, T, m["vocab_size"])


def torch_logits(arrays, m, tok):
    P = {k.removeprefix("transformer."): torch.from_numpy(np.asarray(v, np.float64)) for k, v in arrays.items()}
    cfg = {"n_layer": m["n_layer"], "n_head": m["n_head"]}
    with torch.no_grad():
        return torch_gpt2.gpt2_logits(P, cfg, torch.from_numpy(tok.astype(np.int64))).numpy()


def rel_err(ours, ref):
    return float(np.linalg.norm(ours.astype(np.float64) - ref) / np.linalg.norm(ref))


def compare_logits(arrays, m, model_path, name, n_head=None):
    tok, tok_path = tokens_for(m)
    ours = our_logits(model_path, m, tok, tok_path, name, n_head)
    if ours is None:
        return check(False, f"logits {name}: hf_logits wrote nothing")
    err = rel_err(ours, torch_logits(arrays, m, tok))
    return check(err < LOGITS_TOL, f"logits {name}: ours vs plain-torch fp64, rel err {err:.2e} < {LOGITS_TOL:g}")


def hf_names(m):
    return set(torch_gpt2.param_names(m["n_layer"]))


def hf_shapes(m):
    return torch_gpt2.hf_shapes(m)


# ---- cases ---------------------------------------------------------------------------------------

def case_setup():
    # Only this case's outputs are replaced: hf.json (no fixture) may be running in WORK/case_json.
    os.makedirs(WORK, exist_ok=True)
    for name in ("run_small", "run_big", "hf_small", "hf_big"):
        shutil.rmtree(f"{WORK}/{name}", ignore_errors=True)
    # Token files written with h5py (DESIGN.md section 5), byte-level text.
    text = ("It was the best of times, it was the worst of times, it was the age of wisdom, "
            "it was the age of foolishness. " * 60).encode()
    tokens = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    split = len(tokens) * 9 // 10
    for name, part in (("train.h5", tokens[:split]), ("val.h5", tokens[split:])):
        with h5py.File(f"{WORK}/{name}", "w") as f:
            f.create_dataset("tokens", data=part, chunks=True)
            f.attrs["vocab_size"] = 256
            f.attrs["tokenizer"] = "byte"
            f.attrs["format_version"] = 1
    for tag, m, steps in (("small", SMALL, 6), ("big", BIG, 2)):
        run_ok(train_cmd(m, "--train-data", f"{WORK}/train.h5", "--max-steps", str(steps), "--lr", "3e-3",
                         "--out", f"{WORK}/run_{tag}"), f"train {tag}")
        # The small model is exported from its run directory (ckpt/latest), the big one from the file.
        src = f"{WORK}/run_small" if tag == "small" else f"{WORK}/run_big/ckpt/step_{steps:08d}.h5"
        run_ok([DATA, "export-hf", src, f"{WORK}/hf_{tag}"], f"export-hf {tag}")
    run_ok([DATA, "export-hf", "--help"], "export-hf --help")
    out = run_ok([DATA, "--help"], "gpt2-data --help")
    check("export-hf CKPT DIR" in out, "gpt2-data --help documents export-hf")


def ckpt_of(tag):
    d = f"{WORK}/run_{tag}/ckpt"
    return os.path.join(d, open(f"{d}/latest").read().strip())


def check_config_json(path, m):
    cfg = json.load(open(path))
    eot = 50256 if m["vocab_size"] == 50257 else None
    want = {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": m["n_layer"], "n_head": m["n_head"],
        "n_embd": m["n_embd"], "n_positions": m["max_seq_len"], "n_ctx": m["max_seq_len"],
        "vocab_size": m["vocab_size"], "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": True, "bos_token_id": eot, "eos_token_id": eot, "resid_pdrop": 0.0,
        "embd_pdrop": 0.0, "attn_pdrop": 0.0, "n_inner": None, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "use_cache": True,
        "initializer_range": 0.02, "torch_dtype": "float32", "summary_type": "cls_index",
        "summary_use_proj": True, "summary_activation": None, "summary_proj_to_labels": True,
        "summary_first_dropout": 0.1,
    }
    bad = {k: (cfg.get(k, "<missing>"), v) for k, v in want.items() if cfg.get(k, "<missing>") != v}
    check(not bad, f"{path}: GPT-2 config keys and values" + (f" (got, want): {bad}" if bad else ""))
    extra = set(cfg) - set(want)
    check(not extra, f"{path}: no unexpected keys {sorted(extra) if extra else ''}")


def case_roundtrip():
    for tag, m in (("small", SMALL), ("big", BIG)):
        d = f"{WORK}/hf_{tag}"
        check(sorted(os.listdir(d)) == ["config.json", "model.safetensors"],
              f"{d} holds model.safetensors and config.json only (no temporary files): {sorted(os.listdir(d))}")
        n, header, data, arrays = read_st(f"{d}/model.safetensors")
        check(n % 8 == 0, f"{tag}: header length {n} is a multiple of 8 (aligned data)")
        check(header.get("__metadata__") == {"format": "pt"}, f"{tag}: metadata is {{'format': 'pt'}}")
        names = set(header) - {"__metadata__"}
        check(names == hf_names(m), f"{tag}: tensor names are exactly GPT-2's ({len(names)} tensors)")
        shapes = hf_shapes(m)
        wrong = [k for k in names if tuple(header[k]["shape"]) != tuple(shapes.get(k, ()))]
        check(not wrong, f"{tag}: shapes as Hugging Face's (wte {header['wte.weight']['shape']}) {wrong}")
        check(all(header[k]["dtype"] == "F32" for k in names), f"{tag}: every tensor is F32")
        spans = sorted(tuple(header[k]["data_offsets"]) for k in names)
        tiles = spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and spans[-1][1] == len(data)
        check(tiles, f"{tag}: data_offsets tile the data section exactly")
        with h5py.File(ckpt_of(tag), "r") as f:
            diff = [k for k in names if not np.array_equal(f["model"][k][()], arrays[k])]
        check(not diff, f"{tag}: every tensor equals the checkpoint's bit for bit {diff}")
        check_config_json(f"{d}/config.json", m)
        # Logits: plain torch on the hand-parsed file vs our binary on the checkpoint and on the file.
        compare_logits(arrays, m, f"{d}/model.safetensors", f"{tag}_safetensors")
        tok, tok_path = tokens_for(m)
        a = our_logits(ckpt_of(tag), m, tok, tok_path, f"{tag}_h5")
        b = our_logits(f"{d}/model.safetensors", m, tok, tok_path, f"{tag}_safetensors")
        check(a is not None and b is not None and np.array_equal(a, b),
              f"{tag}: our logits from the safetensors file equal those from the checkpoint bit for bit")
    # Exporting is deterministic, and a second export replaces the first (rename over it).
    before = open(f"{WORK}/hf_small/model.safetensors", "rb").read()
    for i in range(2):
        run_ok([DATA, "export-hf", ckpt_of("small"), f"{TMP}/again"], f"export-hf into a fresh directory, pass {i + 1}")
    check(open(f"{TMP}/again/model.safetensors", "rb").read() == before and
          sorted(os.listdir(f"{TMP}/again")) == ["config.json", "model.safetensors"],
          "a repeated export writes the same bytes and leaves no temporary files")


def case_init_from():
    st = f"{WORK}/hf_small/model.safetensors"
    l_h5, _ = eval_loss(SMALL, ckpt_of("small"), "h5")
    l_st, out = eval_loss(SMALL, st, "safetensors")
    check(l_h5 == l_st and np.isfinite(l_h5), f"eval loss from model.safetensors {l_st!r} == from the checkpoint {l_h5!r}")
    check("Hugging Face safetensors" in out, "the log says the model came from a safetensors file")
    l_big_h5, _ = eval_loss(BIG, ckpt_of("big"), "big_h5")
    l_big_st, _ = eval_loss(BIG, f"{WORK}/hf_big/model.safetensors", "big_safetensors")
    check(l_big_h5 == l_big_st and np.isfinite(l_big_h5), f"vocab 50257: eval loss {l_big_st!r} == {l_big_h5!r}")
    # Without config.json beside it, n_head comes from the run's options; any file name works (sniffed).
    os.makedirs(f"{TMP}/bare", exist_ok=True)
    shutil.copy(st, f"{TMP}/bare/weights.bin")
    l_bare, _ = eval_loss(SMALL, f"{TMP}/bare/weights.bin", "bare")
    check(l_bare == l_h5, f"a safetensors file named weights.bin without config.json: eval loss {l_bare!r}")
    # Fine-tuning from it: a few steps train and checkpoint.
    run_ok(train_cmd(SMALL, "--train-data", f"{WORK}/train.h5", "--max-steps", "2", "--init-from", st,
                     "--out", f"{TMP}/finetune"), "train 2 steps from model.safetensors")
    # The run's model must match the file's, and the message says what to set.
    want = "set --n-layer 2 --n-head 3 --n-embd 48 --vocab-size 300 --max-seq-len 40"
    for what, m in (("n_embd", dict(SMALL, n_embd=96)), ("vocab", dict(SMALL, vocab_size=50257)),
                    ("n_layer", dict(SMALL, n_layer=1)), ("n_head vs config.json", dict(SMALL, n_head=4))):
        rc, out = run(train_cmd(m, "--eval-only", "--init-from", st), timeout=60)
        check(rc not in (0, 124) and want in out, f"mismatched {what}: exit {rc}, message gives the file's dimensions"
              + ("" if want in out else f": {out.strip().splitlines()[-1:]}"))
    # A preset is named when one fits (BIG is d1).
    rc, out = run(train_cmd(SMALL, "--eval-only", "--init-from", f"{WORK}/hf_big/model.safetensors"), timeout=60)
    want = "set --model d1 --vocab-size 50257 --max-seq-len 24"
    check(rc not in (0, 124) and want in out, f"mismatch with a preset's model: exit {rc}, message '{want}'")


def case_dtypes():
    _, _, _, arrays = read_st(f"{WORK}/hf_small/model.safetensors")
    m = SMALL
    T = m["max_seq_len"]
    names = list(arrays)
    mask = np.tril(np.ones((T, T), np.float32)).reshape(1, 1, T, T)
    for dtype in ("F16", "BF16"):
        d = f"{TMP}/{dtype.lower()}"
        os.makedirs(d, exist_ok=True)
        # As transformers saves GPT2LMHeadModel: "transformer." prefix, the lm_head, and (older versions)
        # the causal-mask buffers, one of them a scalar; data in reverse name order, no metadata.
        ts = [("transformer." + k, dtype, arrays[k].shape, encode(arrays[k], dtype)) for k in reversed(names)]
        ts.append(("lm_head.weight", dtype, arrays["wte.weight"].shape, encode(arrays["wte.weight"], dtype)))
        for l in range(m["n_layer"]):
            ts.append((f"transformer.h.{l}.attn.bias", "F32", mask.shape, mask.tobytes()))
            ts.append((f"transformer.h.{l}.attn.masked_bias", "F32", (), np.float32(-1e4).tobytes()))
        path = f"{d}/model.safetensors"
        write_st(path, ts)
        want = {k: decoded(v, dtype) for k, v in arrays.items()}
        compare_logits(want, m, path, dtype, n_head=m["n_head"])
        l16, _ = eval_loss(m, path, dtype)
        l32, _ = eval_loss(m, ckpt_of("small"), f"{dtype}_ref")
        check(abs(l16 - l32) < 1e-2 * abs(l32), f"{dtype} prefixed file: eval loss {l16:.6f} ~ fp32 {l32:.6f}")
    # Every 16-bit pattern converts exactly (NaNs stay NaN).
    bits = np.arange(65536, dtype=np.uint16)
    path = f"{TMP}/all16.safetensors"
    write_st(path, [("f16", "F16", (65536,), bits.tobytes()), ("bf16", "BF16", (256, 256), bits.tobytes())],
             metadata={"format": "pt"})
    for name, want in (("f16", bits.view(np.float16).astype(np.float32)),
                       ("bf16", (bits.astype(np.uint32) << 16).view(np.float32))):
        out = f"{TMP}/all_{name}.f32"
        run_ok([HF_LOGITS, "tensor", path, name, out], f"read all {name} patterns")
        got = np.fromfile(out, dtype=np.float32) if os.path.exists(out) else np.zeros(0, np.float32)
        nan = np.isnan(want)
        ok = got.shape == want.shape and np.array_equal(np.isnan(got), nan) and \
            np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
        check(ok, f"all 65536 {name.upper()} bit patterns convert to fp32 exactly (subnormals, inf, -0, NaN)")


def case_bad_inputs():
    good = f"{WORK}/hf_small/model.safetensors"
    _, header, data, arrays = read_st(good)
    d = TMP
    raw = open(good, "rb").read()
    order = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])

    def tensors(skip=(), edit=None):
        out = []
        for k in order:
            if k in skip:
                continue
            b, e = header[k]["data_offsets"]
            t = (k, "F32", tuple(header[k]["shape"]), data[b:e])
            out.append(edit(t) if edit else t)
        return out

    def make(name, content=None, **kw):
        p = f"{d}/{name}.safetensors"
        if content is not None:
            open(p, "wb").write(content)
        else:
            write_st(p, kw.pop("ts", None) or tensors(), metadata={"format": "pt"}, **kw)
        return p

    def shape_edit(h):
        h["h.0.mlp.c_fc.weight"]["shape"] = [192, 48]

    def offsets_edit(h):
        h["ln_f.bias"]["data_offsets"][1] -= 4

    def gap_edit(h):  # shift one tensor by 4 bytes: a gap before it, an overlap after it
        h["h.1.ln_1.bias"]["data_offsets"] = [x + 4 for x in h["h.1.ln_1.bias"]["data_offsets"]]

    def both_names(t):
        return t if t[0] != "wpe.weight" else ("transformer.wpe.weight",) + t[1:]

    n = struct.unpack("<Q", raw[:8])[0]
    cases = [
        ("truncated", make("truncated", raw[:len(raw) // 2]), r"truncated"),
        ("header-cut", make("header_cut", raw[:8 + n // 2]), r"header length .* goes beyond the end of the file"),
        ("too-short", make("too_short", raw[:5]), r"too short to hold the 8-byte header length"),
        ("empty", make("empty", b""), r"too short"),
        ("length-beyond-file", make("length_beyond", struct.pack("<Q", len(raw)) + raw[8:]),
         r"header length \(\d+ bytes\) goes beyond the end of the file"),
        ("length-huge", make("length_huge", struct.pack("<Q", 2**63 + 5) + raw[8:]), r"goes beyond the end of the file"),
        ("not-json", make("not_json", struct.pack("<Q", 8) + b"{hello: " + data), r"invalid JSON"),
        ("hdf5-named-safetensors", make("hdf5", open(ckpt_of("small"), "rb").read()),
         r"goes beyond the end of the file|does not start with"),
        ("wrong-shape", make("wrong_shape", header_edit=shape_edit),
         r"tensor 'h\.0\.mlp\.c_fc\.weight' has shape \[192, 48\] but the model .* needs \[48, 192\]"),
        ("missing-tensor", make("missing", ts=tensors(skip=("h.1.ln_2.bias",))), r"has no tensor 'h\.1\.ln_2\.bias'"),
        ("unknown-dtype", make("unknown_dtype", header_edit=lambda h: h["wpe.weight"].update(dtype="F17")),
         r"tensor 'wpe\.weight': unknown dtype 'F17'"),
        ("integer-dtype", make("int_dtype", header_edit=lambda h: h["ln_f.weight"].update(dtype="I32")),
         r"tensor 'ln_f\.weight' has dtype I32: only F32, F16 and BF16"),
        ("offsets-vs-shape", make("offsets", header_edit=offsets_edit), r"tensor 'ln_f\.bias': data_offsets .* need 192"),
        ("gap-overlap", make("gap", header_edit=gap_edit), r"\((gap|overlap)\)"),
        ("trailing-bytes", make("trailing", raw_edit=lambda r: r + b"\0" * 12), r"12 bytes follow the last tensor"),
        ("negative-dim", make("negative", header_edit=lambda h: h["ln_f.bias"].update(shape=[-48])),
         r"not a non-negative integer"),
        ("unexpected-tensor", make("unexpected", ts=tensors() + [("score.weight", "F32", (2,), b"\0" * 8)]),
         r"holds tensor 'score\.weight' \[2\], which is not a parameter"),
        ("ambiguous-prefix", make("ambiguous", ts=tensors() + [both_names(t) for t in tensors() if t[0] == "wpe.weight"]),
         r"holds both 'wpe\.weight' and 'transformer\.wpe\.weight'"),
        ("duplicate-key", make("dup", raw_edit=lambda r: dup_key(r)), r"duplicate key \"wte\.weight\""),
        ("missing-file", f"{d}/nope.safetensors", r"file not found: .*nope\.safetensors"),
    ]
    # A config.json beside the file that disagrees with the tensors.
    os.makedirs(f"{d}/cfg", exist_ok=True)
    shutil.copy(good, f"{d}/cfg/model.safetensors")
    json.dump({"n_layer": 5, "n_head": 3}, open(f"{d}/cfg/config.json", "w"))
    cases.append(("config-json-disagrees", f"{d}/cfg/model.safetensors", r"config\.json says n_layer 5 but the tensors"))
    os.makedirs(f"{d}/cfg2", exist_ok=True)
    shutil.copy(good, f"{d}/cfg2/model.safetensors")
    open(f"{d}/cfg2/config.json", "w").write('{"n_head": 3,')
    cases.append(("config-json-invalid", f"{d}/cfg2/model.safetensors", r"config\.json: invalid JSON"))

    for name, path, pattern in cases:
        rc, out = run(train_cmd(SMALL, "--eval-only", "--init-from", path), timeout=60)
        ok = rc not in (0, 124) and re.search(pattern, out) is not None
        check(ok, f"bad input {name}: exit {rc}" + ("" if ok else f", output: {out.strip().splitlines()[-2:]}"))

    # Two ranks: every rank stops, nobody hangs.
    mpiexec = shutil.which("mpiexec")
    if check(mpiexec is not None, "mpiexec found"):
        rc, out = run([mpiexec, "-n", "2"] + train_cmd(SMALL, "--eval-only", "--init-from", f"{d}/truncated.safetensors"),
                      timeout=90)
        check(rc not in (0, 124) and "truncated" in out, f"bad input on 2 ranks: exit {rc}, no hang")

    # export-hf misuse.
    rc, out = run([DATA, "export-hf", f"{d}/nope.h5", f"{d}/out"], timeout=60)
    check(rc not in (0, 124) and "nope.h5" in out, f"export-hf of a missing checkpoint: exit {rc}")
    rc, out = run([DATA, "export-hf", ckpt_of("small")], timeout=60)
    check(rc == 2 and "usage: gpt2-data export-hf CKPT DIR" in out, f"export-hf without DIR: exit {rc}, usage")
    rc, out = run([DATA, "export-hf", good, f"{d}/out"], timeout=60)
    check(rc not in (0, 124) and "not an HDF5 file" in out, f"export-hf of a safetensors file: exit {rc}")
    rc, out = run([DATA, "export-hf", f"{WORK}/train.h5", f"{d}/out"], timeout=60)
    check(rc not in (0, 124) and "is not a checkpoint" in out, f"export-hf of a token file: exit {rc}")
    open(f"{d}/a_file", "w").write("x")
    rc, out = run([DATA, "export-hf", ckpt_of("small"), f"{d}/a_file"], timeout=60)
    check(rc not in (0, 124) and "cannot create directory" in out, f"export-hf into a file: exit {rc}")


def case_json():
    good = [
        '{}', '[]', '0', '-0', '1e-05', '-12.5E+3', '"plain"', 'true', 'false', 'null',
        '{"a": [1, 2, {"b": null}], "c": "x"}',
        r'"escapes: \" \\ \/ \b \f \n \r \t"',
        r'"unicode: \u00e9 \u4e2d \ud83d\ude00 raw: é 中 😀"',
        '  {\n\t"spaced" :\r\n [ 1 , 2 ]  }  ',
        json.dumps({"h.0.attn.c_attn.weight": {"dtype": "F32", "shape": [48, 144], "data_offsets": [0, 27648]}}),
        "[" * 60 + "]" * 60,
    ]
    for i, text in enumerate(good):
        p = f"{TMP}/good{i}.json"
        open(p, "w", encoding="utf-8").write(text)
        rc, out = run([HF_LOGITS, "json", p], timeout=30)
        try:
            same = rc == 0 and json.loads(out) == json.loads(text)
        except ValueError:
            same = False
        check(same, f"json {text[:40]!r}: parsed as Python parses it")
    bad = ['', '{', '{"a" 1}', '{"a": 1,}', '[1 2]', '01', '1.', '.5', '+1', r'"\x"', r'"\u12"', r'"\ud800"', r'"\udc00"',
           '"tab\tin"', 'nul', '{"a": 1, "a": 2}', '{} x', "[" * 70 + "]" * 70, "{'a': 1}"]
    for i, text in enumerate(bad):
        p = f"{TMP}/bad{i}.json"
        open(p, "w", encoding="utf-8").write(text)
        rc, out = run([HF_LOGITS, "json", p], timeout=30)
        check(rc not in (0, 124) and "invalid JSON" in out, f"json {text[:40]!r}: rejected (exit {rc})")


def dup_key(raw):
    """The file with a second "wte.weight" entry in its header (same offsets), length fixed up."""
    n = struct.unpack("<Q", raw[:8])[0]
    text = raw[8:8 + n].decode().rstrip()
    h = json.loads(text)
    entry = json.dumps(h["wte.weight"])
    text = text[:-1] + ', "wte.weight": ' + entry + "}"
    return struct.pack("<Q", len(text)) + text.encode() + raw[8 + n:]


CASES = {"setup": case_setup, "roundtrip": case_roundtrip, "init_from": case_init_from, "dtypes": case_dtypes,
         "bad_inputs": case_bad_inputs, "json": case_json}

if __name__ == "__main__":
    if CASE not in CASES:
        print(f"unknown case {CASE}; one of {', '.join(CASES)}", file=sys.stderr)
        sys.exit(2)
    if CASE not in ("setup", "json") and not os.path.exists(f"{WORK}/hf_small/model.safetensors"):
        print(f"FAIL: {WORK} has no export: run the setup case (CTest fixture hf.setup) first", file=sys.stderr)
        sys.exit(1)
    if CASE != "setup":
        shutil.rmtree(TMP, ignore_errors=True)
        os.makedirs(TMP)
    CASES[CASE]()
    print(f"{CASE}: {len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
