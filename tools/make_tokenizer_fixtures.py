"""Writes tests/fixtures/tokenizer/: tokenizers trained by the HF `tokenizers` library on a corpus
this script writes itself, and the ids that library gives, for memfit's tokenizer parity tests
(tests/text/tokenizer_test.cpp).

  bytelevel.json      GPT-2 style: ByteLevel pre-tokenizer (GPT-2 regex), byte-level BPE
  llama3.json         Llama 3 style: Split(Llama 3 regex) + ByteLevel(use_regex=false), ignore_merges
  qwen2.json          Qwen2 style: NFC normalizer, Split(Qwen2 regex) + ByteLevel(use_regex=false)
  sentencepiece.json  Llama 2 style: Prepend("▁") + Replace(" ", "▁") normalizers, BPE with
                      <0xNN> byte fallback and fuse_unk, Replace/ByteFallback/Fuse/Strip decoders
  metaspace.json      Mistral style: the same model with a Metaspace pre-tokenizer and decoder
  unk_fused.json      the Llama 2 style model without byte fallback: <unk>, fused (fuse_unk)
  corpus.txt          the training corpus (English, C++/Python code, Unicode)
  edge_cases.txt      emoji, ZWJ sequences, combining marks, CJK, control characters, CRLF, tabs,
                      long whitespace runs and invalid UTF-8 bytes
  expected_<name>.json  ids of corpus.txt and edge_cases.txt (invalid bytes read as U+FFFD, as
                      Python's and Rust's lossy UTF-8 decoders do) and of short cases with added
                      and special tokens, what decode(ids) gives (special tokens kept), and the
                      pre-tokens of the edge cases (the pre-tokenizer alone)

Run: /work/venv/bin/python tools/make_tokenizer_fixtures.py (tokenizers 0.23.3 wrote the files).
"""

import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tokenizer")

ENGLISH = """\
The planner builds every training step as a program before it runs a single kernel. Each tensor
has a shape, a dtype and a lifetime; the liveness pass turns lifetimes into byte offsets, and
the arena is allocated once. If the plan does not fit, the run never starts: it stops with the
breakdown and the cheapest changes that would make it fit. Isn't that what you'd want? We've
found that people don't read long error messages, so each one fits on a single line.

Gradient accumulation runs the micro-step program k times and then the optimizer program once.
ZeRO shards the optimizer state (stage 1), the gradients (stage 2) and the parameters (stage 3)
over the data-parallel ranks; 7.5B parameters on 64 devices need 120 GB each without it, and
1.9 GB with stage 3. Offload moves tensors to host memory or to disk, through staging buffers.

She said: "It's 3:45 pm, and the 12th test failed again -- twice!" He replied, 'I'll look.'
Numbers: 0, 1, 42, 1024, 65536, 3.14159, 2.71828, 1e-5, -7, +12, 100%, $19.99, #5, 4x4.
Lists: apples, oranges; pears & plums / figs | dates... (maybe) [never] {always} <sometimes>.
"""

STORY = """\
On the third night the lighthouse keeper wrote in his log: "Wind from the north-east, rising.
Two ships passed before midnight; neither answered the lamp." He had kept the log for eleven
years, and in all that time the entries had changed very little. Weather, ships, the oil.
Sometimes a line about the gulls, or about the boy who rowed out on Thursdays with bread,
letters and, once, a small wooden box that held nothing but sand from a beach far to the south.

Recipe (serves 4): 200 g flour, 2 eggs, 300 ml milk, a pinch of salt. Whisk; rest 30 minutes;
cook thin pancakes in a hot pan, about 1 minute per side. Serve with lemon & sugar -- or jam.

Q: What's the difference between a process and a thread?
A: Processes have separate address spaces; threads share one. Switching between threads is
   cheaper, but a bug in one thread can corrupt memory every other thread relies on.

  * item one
  * item two, indented
      - a nested item with    irregular   spacing
"""

CODE = """\
#include <cstdint>
#include <vector>

// Sums the first n squares; n < 2^20 keeps the result inside int64_t.
int64_t sum_of_squares(int64_t n) {
  int64_t total = 0;
  for (int64_t i = 1; i <= n; ++i) total += i * i;
  return total;
}

def merge_pairs(tokens, merges):
    \"\"\"Applies BPE merges in rank order.\"\"\"
    while len(tokens) > 1:
        pairs = [(merges.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(tokens, tokens[1:]))]
        rank, i = min(pairs)
        if rank == 1 << 30:
            break
        tokens[i:i + 2] = [tokens[i] + tokens[i + 1]]
    return tokens

\tif (x != y && y >= 0) { return x % y; }   // tabs and trailing spaces   
"""

UNICODE = """\
Café, naïve, résumé, façade, Ångström, Zürich, São Paulo, Kraków, İstanbul.
Ελληνικά: γεια σου κόσμε. Русский: привет, мир. עברית: שלום. العربية: مرحبا بالعالم.
日本語のテキスト、中文文本，한국어 텍스트。 Emoji: 😀 🚀 👍🏽 ❤️ 🇫🇷 👨‍👩‍👧‍👦.
Math: ∑ x² ≤ ∞, α + β = γ, √2 ≈ 1.414, ½ ¾ ⅓. Quotes: “curly” ‘single’ «guillemets» — dash – en.
"""

EDGE_CASES_TEXT = (
    "emoji 😀😃😄 family 👨‍👩‍👧‍👦 flag 🇯🇵🇺🇸 skin 👋🏿 heart ❤️‍🔥\n"
    "combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0335\u0321\u0322\u0327 q\u0307\u0323\n"
    "NFC: cafe\u0301 \u00e9 \u212b \u1100\u1161\u11a8 \ufb01 \u2460 \uff21 x\u0323\u0307 \u0958\n"
    "CJK: 漢字かなカナ汉字 한국어 𠀀𠀁 (supplementary)\n"
    "control: \x00 \x01\x02\x07\x1b[0m \x7f \u0085 \u200b\u200c\u200d \ufeff \u2028 \u2029\n"
    "CRLF line\r\nanother\r\n\r\n"
    "tabs\t\tand\tmore\t \t\n"
    "long spaces:" + " " * 40 + "end\n"
    "nbsp:\u00a0\u00a0x ideographic space:\u3000y thin:\u2009z\n"
    "         leading spaces\n\n\n\n"
    "漢字で始まる行 (a line opening with CJK)\n"
    "\u3000a line opening with an ideographic space\n"
    "\u00a0a line opening with a no-break space\n"
    "\u0301a line opening with a combining mark\n"
    "Ωmega opens this line\n"
    "digits ١٢٣ ४५६ 12345678901234567890 ½\n"
    "apostrophes: it's IT'S we'LL 'd 'm O'Neil\n"
    "special text: <|endoftext|> <s> </s> <unk> <0x41> ▁already▁metaspace\n"
)
# Invalid UTF-8: a lone continuation byte, a truncated 3-byte sequence, an overlong encoding, a
# surrogate, bytes that never occur (0xFF, 0xC0), and a truncated sequence at the very end.
INVALID_BYTES = b"bad: \x80 x \xe2\x82 y \xc0\xaf z \xed\xa0\x80 w \xff\xfe v \xf0\x9f\x98 end \xe2"

CASES = [
    "", " ", "  ", "\n", "a", "hello world", " hello", "hello ", "Hello  world\n\nNew paragraph",
    "<|endoftext|>", "hi<|endoftext|>there", "<|endoftext|><|endoftext|>", " <|endoftext|> x",
    "<|user|> ask memfit", "<|user hi <|user|", "<|user|>|>", "a memfit b memfit", "<s>hello</s>", "hello<s> world", "<unk>", "x<unk>y",
    "<|im_start|>user\nhi<|im_start|>", "<|endoftext", "<s", "▁", "▁▁x", "héllo wörld 😀", "\ufffd",
    "tab\tnewline\ncarriage\r\nend", "1234567 89", "don't", "DON'T", "x" * 50, "a zebra crossing",
]


def train(tokenizer, vocab_size, special, corpus, limit_alphabet=None, initial_alphabet=()):
    kwargs = dict(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                  initial_alphabet=list(initial_alphabet))
    if limit_alphabet is not None:
        kwargs["limit_alphabet"] = limit_alphabet
    tokenizer.train_from_iterator(corpus.splitlines(keepends=True), trainers.BpeTrainer(**kwargs))
    return tokenizer


def byte_level(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    train(tok, 700, ["<|endoftext|>"], corpus, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # "<|user" overlaps "<|user|>": the longest match wins.
    tok.add_tokens([AddedToken("<|user|>", normalized=False), AddedToken("<|user", normalized=False),
                    AddedToken(" memfit", normalized=True)])
    return tok


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3(corpus):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, 650, ["<|begin_of_text|>", "<|endoftext|>"], corpus,
          initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # A word in the vocabulary that no merge sequence reaches: ignore_merges takes it whole.
    spec = json.loads(tok.to_str())
    spec["model"]["vocab"]["Ġzebra"] = max(spec["model"]["vocab"].values()) + 1
    return Tokenizer.from_str(json.dumps(spec))


QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen2(corpus):
    """Qwen2 style: an NFC normalizer, Split(Qwen2 regex: single digits) + ByteLevel."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, 600, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], corpus,
          initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return tok


def with_byte_fallback_vocab(tok):
    """Llama 2's layout: <unk> <s> </s>, then the 256 <0xNN> byte tokens (vocabulary only, not
    added tokens), then the trained pieces; merges are by string so they carry over."""
    spec = json.loads(tok.to_str())
    trained = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in trained:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    spec["model"]["vocab"] = vocab
    spec["added_tokens"] = [
        {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for t in ("<unk>", "<s>", "</s>")]
    return Tokenizer.from_str(json.dumps(spec))


def sentencepiece(corpus):
    """Trained with a Metaspace split (SentencePiece keeps pieces inside words); saved in
    Llama 2's form: Prepend + Replace normalizers and no pre-tokenizer."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    train(tok, 500, ["<unk>", "<s>", "</s>"], corpus)  # (limit_alphabet breaks ties at random)
    tok = with_byte_fallback_vocab(tok)
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_tokens([AddedToken("<|im_start|>", normalized=False)])
    return tok


def metaspace(sp):
    """Mistral's newer form of the same model: a Metaspace pre-tokenizer and decoder."""
    tok = Tokenizer.from_str(sp.to_str())
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False),
                                     decoders.ByteFallback(), decoders.Fuse()])
    return tok


def without_byte_fallback(sp):
    """The same model with byte_fallback off: characters outside the vocabulary become <unk>, runs
    of them fused into one (fuse_unk)."""
    spec = json.loads(sp.to_str())
    spec["model"]["byte_fallback"] = False
    return Tokenizer.from_str(json.dumps(spec))


def expected(tok, corpus, edge_text):
    def encode(text):
        ids = tok.encode(text, add_special_tokens=False).ids
        return {"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)}
    def pre_tokens(text):  # the pre-tokenizer alone, on the raw text: pins the regex splits down
        return [piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text)] if tok.pre_tokenizer else []
    return {"corpus": encode(corpus), "edge_cases": encode(edge_text), "cases": [encode(c) for c in CASES],
            "edge_case_pre_tokens": pre_tokens(edge_text)}


def main():
    os.makedirs(OUT, exist_ok=True)
    corpus = ENGLISH + STORY + CODE + UNICODE
    edge_bytes = EDGE_CASES_TEXT.encode("utf-8") + INVALID_BYTES
    with open(os.path.join(OUT, "corpus.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(corpus)
    with open(os.path.join(OUT, "edge_cases.txt"), "wb") as f:
        f.write(edge_bytes)
    edge_text = edge_bytes.decode("utf-8", errors="replace")
    sp = sentencepiece(corpus)
    for name, tok in [("bytelevel", byte_level(corpus)), ("llama3", llama3(corpus)), ("qwen2", qwen2(corpus)),
                      ("sentencepiece", sp),
                      ("metaspace", metaspace(sp)), ("unk_fused", without_byte_fallback(sp))]:
        tok.save(os.path.join(OUT, f"{name}.json"), pretty=False)
        with open(os.path.join(OUT, f"expected_{name}.json"), "w", encoding="utf-8") as f:
            json.dump(expected(tok, corpus, edge_text), f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")


if __name__ == "__main__":
    main()
