#!/usr/bin/env python3
"""Regenerate tests/fixtures/generate/: transformers' greedy generate on the committed tiny
models, the reference memfit generate is compared with token for token.

For each of gpt2_tiny_torch, llama_tiny_torch (grouped-query attention: 4 heads over 2 kv
heads) and llama31_tiny_torch (llama3 rope scaling, GQA) it writes <name>.safetensors with
  prompt  int32 [P]        a seeded prompt (P = 8) of ids in [0, vocab)
  tokens  int32 [N]        model.generate(prompt, max_new_tokens=N, do_sample=False), N = 32
  logits  float32 [N, V]   the logits each new token was chosen from (output_logits=True)
  margin  float32 [N]      top-1 minus top-2 logit of each step (how far from a tie the step is)
The fixtures' configs have eos_token_id null, so generation never stops early: memfit's run
compares with the same rule (no eos). fp32, CPU, one thread.

Run from the repository root:
  /work/venv/bin/python tools/make_generate_fixtures.py
"""

from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

MODELS = ("gpt2_tiny_torch", "llama_tiny_torch", "llama31_tiny_torch")
PROMPT, NEW = 8, 32


def main():
    root = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
    out_dir = root / "generate"
    out_dir.mkdir(exist_ok=True)
    torch.set_num_threads(1)
    for i, name in enumerate(MODELS):
        model = AutoModelForCausalLM.from_pretrained(root / name, dtype=torch.float32).eval()
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(1234 + i)
        prompt = torch.randint(0, vocab, (1, PROMPT), generator=g)
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, use_cache=True,
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        tokens = out.sequences[0, PROMPT:]
        logits = torch.stack([l[0, :vocab] for l in out.logits]).float()
        top2 = logits.topk(2, dim=-1).values
        save_file({"prompt": prompt[0].to(torch.int32).contiguous(), "tokens": tokens.to(torch.int32).contiguous(),
                   "logits": logits.contiguous(), "margin": (top2[:, 0] - top2[:, 1]).contiguous()},
                  str(out_dir / f"{name.removesuffix('_torch')}.safetensors"))
        print(name, "tokens", tokens.tolist(), "smallest margin", float((top2[:, 0] - top2[:, 1]).min()))


if __name__ == "__main__":
    main()
