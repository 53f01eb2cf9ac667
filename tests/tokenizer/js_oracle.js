// The reference side of test_bpe_vs_js.py: the npm package gpt-3-encoder, run as it is.
//
//   node js_oracle.js MODULE_DIR encode FILE...   ids of each UTF-8 file, one line per file
//   node js_oracle.js classes                     Unicode version, then JSON ranges [first, last, class]
//                                                 of /\p{L}/u (1), /\p{N}/u (2) and /\s/u (3)
//
// gpt-3-encoder's encode() appends each piece's tokens with Array.concat, which is quadratic in the
// number of tokens; long texts are therefore encoded in chunks cut just before a U+0020 that has a
// non-space on both sides. Such a cut is always a piece boundary of GPT-2's pattern (no alternative
// matches across "\S \S" except at the space, and the pattern has no lookbehind), so the ids are those
// of the whole text.
'use strict';
const fs = require('fs');
const path = require('path');

function classes() {
  const L = /\p{L}/u, N = /\p{N}/u, S = /\s/u;
  const out = [];
  let start = 0, cur = -1;
  for (let cp = 0; cp <= 0x110000; cp++) {
    let c = -1;
    if (cp <= 0x10FFFF) {
      c = 0;
      if (cp < 0xD800 || cp > 0xDFFF) {
        const s = String.fromCodePoint(cp);
        c = L.test(s) ? 1 : N.test(s) ? 2 : S.test(s) ? 3 : 0;
      }
    }
    if (c !== cur) {
      if (cur > 0) out.push('[' + start + ',' + (cp - 1) + ',' + cur + ']');
      start = cp;
      cur = c;
    }
  }
  process.stdout.write(process.versions.unicode + '\n[' + out.join(',') + ']\n');
}

function encodeLong(encode, text) {
  const ids = [];
  const cut = /(?<=\S) (?=\S)/gu;
  const kChunk = 2000;
  let start = 0;
  cut.lastIndex = kChunk;
  for (let m; (m = cut.exec(text)) !== null; cut.lastIndex = m.index + kChunk) {
    for (const id of encode(text.slice(start, m.index))) ids.push(id);
    start = m.index;
  }
  for (const id of encode(text.slice(start))) ids.push(id);
  return ids;
}

const args = process.argv.slice(2);
if (args[0] === 'classes') {
  classes();
} else if (args.length >= 2 && args[1] === 'encode') {
  const { encode } = require(path.join(path.resolve(args[0]), 'node_modules', 'gpt-3-encoder'));
  const lines = [];
  for (const file of args.slice(2)) {
    const ids = encodeLong(encode, fs.readFileSync(file, 'utf8'));
    if (ids.some((id) => typeof id !== 'number')) throw new Error(file + ': the encoder produced a non-id');
    lines.push(ids.join(' '));
  }
  process.stdout.write(lines.join('\n') + '\n');
} else {
  process.stderr.write('usage: node js_oracle.js classes | node js_oracle.js MODULE_DIR encode FILE...\n');
  process.exit(2);
}
