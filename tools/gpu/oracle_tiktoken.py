#!/usr/bin/env python3
"""Oracle only the GPU machine has: our GPT-2 BPE ids equal tiktoken's `gpt2` encoding, on a few MB of
varied text (English prose, C++ source, and seeded text from many scripts and symbol classes).

  oracle_tiktoken.py BUNDLE_BIN BUNDLE_DATA

That machine has no network: tiktoken reads the vocabulary from its cache directory, filled here from
the bundle's copy (the same files, checked by tiktoken against OpenAI's sha256). Exit 77 without tiktoken.
"""
import faulthandler
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

# On the H100 (2026-11-27) this step ran into its 90 s limit having printed nothing (its output was still
# buffered): every stage now reports as it ends, and a stage stuck for 45 s prints where it is stuck (that
# found it: varied_text summed its whole list at every piece).
faulthandler.dump_traceback_later(45, exit=True)
t0 = time.monotonic()


def stage(what):
    print(f"[{time.monotonic() - t0:5.1f} s] {what}", flush=True)
    faulthandler.cancel_dump_traceback_later()  # 45 s for each stage, not for the whole run
    faulthandler.dump_traceback_later(45, exit=True)


try:
    import tiktoken
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

bin_dir, data = sys.argv[1], sys.argv[2]
vocab = os.path.join(data, "gpt2-vocab")
cache = tempfile.mkdtemp(prefix="tiktoken-cache.")
for name in ("vocab.bpe", "encoder.json"):
    url = f"https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/{name}"
    shutil.copy(os.path.join(vocab, name), os.path.join(cache, hashlib.sha1(url.encode()).hexdigest()))
os.environ["TIKTOKEN_CACHE_DIR"] = cache
stage(f"tiktoken {tiktoken.__version__} imported")
enc = tiktoken.get_encoding("gpt2")
stage("tiktoken's gpt2 encoding loaded from the bundle's vocabulary")


def varied_text(seed, n_chars):
    """Seeded text mixing scripts, digits, combining marks, emoji, whitespace runs and contractions."""
    rnd = random.Random(seed)
    ranges = [(0x41, 0x7A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
              (0x900, 0x97F), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x1F300, 0x1F64F),
              (0x2000, 0x206F), (0x20A0, 0x20CF), (0x300, 0x36F), (0x660, 0x669), (0xFF10, 0xFF19), (0x30, 0x39)]
    pieces = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000",
              "...", "--", "$5.99", "e.g.", "C++", "x86_64", "    "]
    out, length = [], 0  # a running length: summing the list each time made this quadratic (minutes)
    while length < n_chars:
        if rnd.random() < 0.3:
            piece = rnd.choice(pieces)
        else:
            lo, hi = rnd.choice(ranges)
            piece = "".join(chr(rnd.randint(lo, hi)) for _ in range(rnd.randint(1, 12)))
        if rnd.random() < 0.5:
            piece += " "
        out.append(piece)
        length += len(piece)
    return "".join(out)


work = tempfile.mkdtemp(prefix="tiktoken-oracle.")
texts = {}
for name in ("kjv.txt", "source.txt"):
    texts[name] = open(os.path.join(data, "text", name), encoding="utf-8").read()
for seed in range(4):
    texts[f"varied_{seed}.txt"] = varied_text(seed, 250_000)
files = []
for name, text in texts.items():
    text = text.replace("<|endoftext|>", "")  # a special token for tiktoken; plain text for our encoder
    texts[name] = text
    path = os.path.join(work, name)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    files.append(path)

stage(f"{len(files)} texts written")
r = subprocess.run([f"{bin_dir}/tokenizer_bpe_tool", vocab, "encode", *files], capture_output=True, text=True)
stage(f"ours: tokenizer_bpe_tool exited {r.returncode}")
if r.returncode != 0:
    print(r.stderr[-2000:])
    raise SystemExit(f"FAIL: tokenizer_bpe_tool exited {r.returncode}")
lines = r.stdout.splitlines()
if len(lines) != len(files):
    raise SystemExit(f"FAIL: tokenizer_bpe_tool printed {len(lines)} lines for {len(files)} files")
total, bad = 0, 0
for (name, text), line in zip(texts.items(), lines):
    ours = [int(t) for t in line.split()]
    theirs = enc.encode(text, disallowed_special=())
    stage(f"tiktoken encoded {name}")
    total += len(theirs)
    if ours != theirs:
        bad += 1
        i = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        print(f"MISMATCH {name}: first at token {i}: ours {ours[i:i + 8]} tiktoken {theirs[i:i + 8]} "
              f"(text {enc.decode(theirs[max(0, i - 4):i + 4])!r}); lengths {len(ours)} vs {len(theirs)}")
mb = sum(len(t.encode()) for t in texts.values()) / 1e6
print(f"{total} tokens compared over {len(files)} files ({mb:.1f} MB): "
      f"{'identical' if bad == 0 else f'{bad} file(s) differ'} (tiktoken {tiktoken.__version__})")
shutil.rmtree(work, ignore_errors=True)
shutil.rmtree(cache, ignore_errors=True)
sys.exit(0 if bad == 0 else 1)
