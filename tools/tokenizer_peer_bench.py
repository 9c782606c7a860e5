"""The HF `tokenizers` library's side of bench/tokenizer_bench: MB/s on the same file.

  /work/venv/bin/python tools/tokenizer_peer_bench.py TOKENIZER(.json|DIR) FILE [repeats]
  RAYON_NUM_THREADS=N sets the library's threads for the batch run (default: all cores).

1. one thread: tok.encode(text, add_special_tokens=False) on the whole file as one text (the
   file read as UTF-8 with errors="replace", as memfit reads invalid bytes), best of `repeats`;
2. all cores: tok.encode_batch over the same chunks memfit tokenize encodes (about 1 MiB, cut
   at a line start: a newline followed by printable non-space ASCII or a letter or number), including the split.
Prints MB/s of the file's bytes and the token counts, to compare with memfit's.
"""

import os
import sys
import time

from tokenizers import Tokenizer

CHUNK = 1 << 20


def is_line_start_char(data, p):
    """Printable non-space ASCII, or a letter or number (Tokenizer::is_line_start)."""
    if 0x20 < data[p] < 0x7F:
        return True
    if data[p] < 0xC2:
        return False
    n = 2 if data[p] < 0xE0 else 3 if data[p] < 0xF0 else 4
    try:
        ch = data[p:p + n].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return ch.isalpha() or ch.isnumeric()


def line_start_chunks(data):
    """The chunks memfit tokenize cuts (text/tokenize_files.cpp), as strings."""
    chunks, begin = [], 0
    while begin < len(data):
        p = begin + CHUNK
        while p < len(data) and not (data[p - 1] == 0x0A and is_line_start_char(data, p)):
            p += 1
        p = min(p, len(data))
        chunks.append(data[begin:p].decode("utf-8", errors="replace"))
        begin = p
    return chunks


def main():
    path, file = sys.argv[1], sys.argv[2]
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    tok = Tokenizer.from_file(path)
    data = open(file, "rb").read()
    text = data.decode("utf-8", errors="replace")
    mb = len(data) / 1e6

    best, tokens = float("inf"), 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        tokens = len(tok.encode(text, add_special_tokens=False).ids)
        best = min(best, time.perf_counter() - t0)
    print(f"tokenizers one thread: {mb / best:.2f} MB/s ({mb:.2f} MB in {best:.3f} s, {tokens} tokens)")

    best, streamed = float("inf"), 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        encodings = tok.encode_batch(line_start_chunks(data), add_special_tokens=False)
        streamed = sum(len(e.ids) for e in encodings)
        best = min(best, time.perf_counter() - t0)
    threads = os.environ.get("RAYON_NUM_THREADS", str(os.cpu_count()))
    print(f"tokenizers {threads} threads (encode_batch, 1 MiB chunks): {mb / best:.2f} MB/s ({best:.3f} s, "
          f"{streamed} tokens)")


if __name__ == "__main__":
    main()
