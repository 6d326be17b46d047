#!/usr/bin/python3
"""Writes the tokenizer test fixtures from reference GPT-2 encoders, never from codagpt's own code.

  tests/data/tokenizer_cases.json    hard strings, invalid UTF-8 and TinyShakespeare, with the ids
                                     of the GPT-2 reference (OpenAI's encoder.py algorithm below,
                                     run with Python's `regex` module, as GPT-2 itself does);
  tests/data/tokenizer_classes.json  the class (L, N, whitespace, other) that `regex` gives every
                                     code point, as ranges.

With --npm the same strings are also encoded with the npm package gpt-3-encoder@1.1.4 (fetched with
`npm pack` into a temporary folder). Where it disagrees with the Python reference (JavaScript's \\s
is not Unicode's White_Space: it adds U+FEFF and lacks U+0085), the Python ids stay the expected
ones and the case records the JavaScript ids and a note.

Usage (Debian: apt-get install python3-regex; needs node + npm for --npm):
  /usr/bin/python3 tests/tools/gen_tokenizer_cases.py --npm [--gpt2-dir DIR] [--shakespeare FILE]
"""
import argparse
import hashlib
import importlib.metadata
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile

import regex as re

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
NPM_PACKAGE = "gpt-3-encoder@1.1.4"


# ---------------------------------------------------------------- OpenAI's encoder.py (gpt-2/src)
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def get_pairs(word):
    pairs = set()
    prev_char = word[0]
    for char in word[1:]:
        pairs.add((prev_char, char))
        prev_char = char
    return pairs


class Encoder:
    def __init__(self, encoder, bpe_merges):
        self.encoder = encoder
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = dict(zip(bpe_merges, range(len(bpe_merges))))
        self.cache = {}
        self.pat = re.compile(
            r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        word = " ".join(word)
        self.cache[token] = word
        return word

    def pretokenize(self, text):
        return re.findall(self.pat, text)

    def encode(self, text):
        bpe_tokens = []
        for token in self.pretokenize(text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            bpe_tokens.extend(self.encoder[t] for t in self.bpe(token).split(" "))
        return bpe_tokens


def load_encoder(gpt2_dir):
    with open(os.path.join(gpt2_dir, "encoder.json"), "r") as f:
        encoder = json.load(f)
    with open(os.path.join(gpt2_dir, "vocab.bpe"), "r", encoding="utf-8") as f:
        bpe_data = f.read()
    merges = [tuple(merge_str.split()) for merge_str in bpe_data.split("\n")[1:-1]]
    return Encoder(encoder, merges)


# ---------------------------------------------------------------- the strings
HARD_STRINGS = [
    ("empty", ""),
    ("plain", "Hello world"),
    ("accents", "Héllo wörld, ça va? Ångström, naïve café, Smørrebrød, Łódź, İstanbul"),
    ("combining_marks", "cafe\u0301 e\u0301e\u0301 a\u0300\u0316 n\u0303o Z\u0351\u0334a\u0315l\u0327go"),
    ("cjk", "你好，世界！日本語のテキスト。カタカナ 한국어 텍스트"),
    ("emoji", "I ❤️ 🍕 and 👍🏽 👍 😀😀😀"),
    ("emoji_zwj", "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🧑🏿‍💻 coder, 👁️‍🗨️"),
    ("mixed_whitespace", "a  \n\n  b\t\t c   "),
    ("trailing_spaces", "trailing spaces   "),
    ("leading_spaces", "   leading"),
    ("only_newlines", "\n\n\n"),
    ("single_space", " "),
    ("single_tab", "\t"),
    ("space_tab_word", "a \tb \t\tc\t d"),
    ("crlf", "line one\r\n line two\r\n\r\n"),
    ("digits", "12345 3.14"),
    ("numbers", "1,000,000 and 0.5% of 2024-01-31, 007 x 1e-9 #42"),
    ("other_numbers", "٣٤٥ ۱۲ Ⅻ ½ ² ①②③ 𝟙𝟚 ൧൨"),
    ("contractions", "I'm, you're, he's, it'll, we've, they'd, don't, won't"),
    ("contractions_upper", "I'M YOU'RE HE'S IT'LL WE'VE THEY'D DON'T 'S 'T 'Re 'rE"),
    ("apostrophes", "rock'n'roll 'quoted' ''s !'s 's's ' s '"),
    ("curly_apostrophe", "it’s don’t ‘single’ “double”"),
    ("code_python", "def f(x):\n    return x**2  # square\n\n\nprint(f(3))\n"),
    ("code_c", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n"),
    ("code_json", '{"key": [1, 2.5, null], "nested": {"a": "b\\n"}}'),
    ("eot_text", "<|endoftext|>"),
    ("eot_inside", "Hello<|endoftext|>World <|endoftext|> again"),
    ("punctuation", "naïve—dash…ellipsis «quotes» „German“ ¿qué? ¡sí! ..."),
    ("nbsp", "a\u00a0b \u00a0 c\u00a0\u00a0d"),
    ("ideographic_space", "a\u3000b\u3000\u3000c"),
    ("unicode_spaces", "a\u2002b\u2003c\u2009d\u200ae\u202ff\u205fg\u1680h\u2028i\u2029j"),
    ("bom_start", "\ufeffBOM at the start"),
    ("bom_inside", "a\ufeffb \ufeff c\ufeff"),
    ("nel", "a\u0085b \u0085c\u0085\u0085"),
    ("info_separators", "a\u001cb\u001dc \u001e\u001fd"),
    ("zero_width", "a\u200bb a\u200cb a\u200db \u2060x"),
    ("controls", "a\x00b\x07c\x7f d\x1b[0m\x08"),
    ("vertical_ws", "a\x0bb\x0cc \x0b\x0c d"),
    ("private_use_and_noncharacters", "\ue000\uf8ff \U000f0000 \uffff \U0010ffff"),
    ("scripts", "Привет, мир! Γειά σου κόσμε. שלום עולם مرحبا بالعالم नमस्ते दुनिया สวัสดีครับ"),
    ("long_word", "Supercalifragilisticexpialidocious " + "a" * 300),
    ("long_base64", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ"),
    ("repeated_punct", "!!!??? ... --- === *** ~~~ ___"),
    ("math", "∀x∈ℝ: x² ≥ 0, ∑ᵢ aᵢ ≈ π·r²"),
    ("fffd", "a\ufffdb \ufffd\ufffd"),
]

# Bytes that are not UTF-8: each maximal ill-formed subsequence becomes one U+FFFD.
INVALID_UTF8 = [
    ("lone_continuation", b"a\x80b"),
    ("continuation_run", b"\x80\x80\xbf x"),
    ("truncated_2", b"ab\xc3"),
    ("truncated_2_mid", b"\xc3 x"),
    ("truncated_3", b"\xe2\x82"),
    ("truncated_3_mid", b"\xe2\x82x y"),
    ("truncated_4", b"\xf0\x9f\x98 smile"),
    ("overlong_2", b"\xc0\xaf slash"),
    ("overlong_3", b"\xe0\x80\xaf"),
    ("overlong_4", b"\xf0\x80\x80\xaf"),
    ("surrogate_high", b"x\xed\xa0\x80y"),
    ("surrogate_low", b"\xed\xbf\xbf"),
    ("surrogate_pair", b"\xed\xa0\xbd\xed\xb8\x80"),
    ("above_max", b"\xf4\x90\x80\x80"),
    ("lead_f5", b"\xf5\x80\x80\x80"),
    ("bytes_fe_ff", b"\xfe\xff \xff"),
    ("mixed", "héllo ".encode() + b"\xff" + " wörld ".encode() + b"\xe4\xbd" + "你好".encode()),
]


def random_strings(count, length, seed):
    """Random mixes of every class boundary the pre-tokenizer has to get right."""
    pool = (list(" " * 12) + list("\t\n\r\x0b\x0c") + list("\u00a0\u3000\u2009\u0085\ufeff\u001c") +
            list("aAzZ") + list("éßØ") + list("日本한") + list("0123456789") + list("٣Ⅻ½²") +
            list("'''") + list("sStTmdlrev") + list(".,!?-_\"#()") + ["\u0301", "\u200d", "\u0300"] +
            ["😀", "👍", "🏽", "\ufffd", "\ue000"])
    rng = random.Random(seed)
    return ["".join(rng.choice(pool) for _ in range(length)) for _ in range(count)]


# ---------------------------------------------------------------- the npm cross-check
NODE_SCRIPT = r"""
const enc = require(process.argv[1]);
const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const dec = new TextDecoder('utf-8');
const out = input.map(c => c.hex !== undefined
  ? {text: dec.decode(Buffer.from(c.hex, 'hex')), ids: enc.encode(dec.decode(Buffer.from(c.hex, 'hex')))}
  : {ids: enc.encode(c.text)});
process.stdout.write(JSON.stringify(out));
"""


def npm_encode(inputs):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "pack", NPM_PACKAGE, "--silent"], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL)
        with tarfile.open(os.path.join(tmp, "gpt-3-encoder-1.1.4.tgz")) as tar:
            tar.extractall(tmp)
        result = subprocess.run(["node", "-e", NODE_SCRIPT, os.path.join(tmp, "package")],
                                input=json.dumps(inputs), capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


# ---------------------------------------------------------------- the character classes
def class_table():
    """[first code point, class] wherever the class changes; classes as the regex sees them.
    Code points unassigned in the regex module's Unicode version are marked as such (to the
    pre-tokenizer they are "other"), so that a test against a newer or older ICU can skip them."""
    def cls(c):
        ch = chr(c)
        if re.match(r"\p{Cn}", ch):
            return "unassigned"
        if re.match(r"\s", ch):
            return "space"
        if re.match(r"\p{L}", ch):
            return "letter"
        if re.match(r"\p{N}", ch):
            return "number"
        return "other"
    ranges = []
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue  # not encodable in UTF-8
        k = cls(c)
        if not ranges or ranges[-1][1] != k:
            ranges.append([c, k])
    return ranges


def fnv1a64_ids(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def find_default(rel_paths):
    candidates = []
    if os.environ.get("CODAGPT_DATA"):
        candidates.append(os.path.join(os.environ["CODAGPT_DATA"], rel_paths[0]))
    candidates += [os.path.join(ROOT, p) for p in rel_paths[1:]]
    return next((p for p in candidates if os.path.exists(p)), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpt2-dir", default=find_default(["gpt2", "data/gpt2", "../shared/data/gpt2"]))
    ap.add_argument("--shakespeare", default=find_default(
        ["tinyshakespeare.txt", "data/tinyshakespeare.txt", "../shared/data/tinyshakespeare.txt"]))
    ap.add_argument("--npm", action="store_true", help="cross-check with npm " + NPM_PACKAGE)
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "tests", "data"))
    args = ap.parse_args()
    if not args.gpt2_dir:
        sys.exit("gen_tokenizer_cases: no encoder.json/vocab.bpe found: run scripts/get_tokenizer.sh")
    enc = load_encoder(args.gpt2_dir)

    cases = []
    for name, text in HARD_STRINGS:
        cases.append({"name": name, "text": text})
    for n, text in enumerate(random_strings(24, 120, seed=20240531)):
        cases.append({"name": f"random_{n}", "text": text})
    for name, raw in INVALID_UTF8:
        cases.append({"name": "invalid_" + name, "hex": raw.hex(),
                      "replaced": raw.decode("utf-8", errors="replace")})
    for c in cases:
        text = c.get("replaced", c.get("text"))
        c["pretokens"] = enc.pretokenize(text)
        c["ids"] = enc.encode(text)

    disagreements = 0
    if args.npm:
        js = npm_encode([{"hex": c["hex"]} if "hex" in c else {"text": c["text"]} for c in cases])
        for c, j in zip(cases, js):
            if "hex" in c and j["text"] != c["replaced"]:
                sys.exit(f"gen_tokenizer_cases: TextDecoder and Python replace {c['name']} differently")
            if j["ids"] != c["ids"]:
                disagreements += 1
                c["js_ids"] = j["ids"]
                c["note"] = ("npm gpt-3-encoder differs (JavaScript \\s includes U+FEFF and lacks "
                             "U+0085); expected ids are the Python regex reference")

    fixture = {
        "generator": "tests/tools/gen_tokenizer_cases.py",
        "reference": "OpenAI gpt-2 encoder.py with Python regex " + importlib.metadata.version("regex") +
                     (", cross-checked with npm " + NPM_PACKAGE if args.npm else ""),
        "cases": cases,
    }
    if args.shakespeare:
        with open(args.shakespeare, "rb") as f:
            raw = f.read()
        ids = enc.encode(raw.decode("utf-8"))
        fixture["tinyshakespeare"] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
                                      "num_tokens": len(ids), "ids_fnv1a64": f"{fnv1a64_ids(ids):016x}"}
    with open(os.path.join(args.out_dir, "tokenizer_cases.json"), "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")

    classes = {"generator": "tests/tools/gen_tokenizer_cases.py", "ranges": class_table()}
    with open(os.path.join(args.out_dir, "tokenizer_classes.json"), "w") as f:
        json.dump(classes, f, separators=(",", ":"))
        f.write("\n")
    print(f"gen_tokenizer_cases: {len(cases)} cases, {disagreements} npm disagreements, "
          f"{len(classes['ranges'])} class ranges -> {args.out_dir}")


if __name__ == "__main__":
    main()
