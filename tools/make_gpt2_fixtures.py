#!/usr/bin/env python3
"""Regenerate the PyTorch reference fixtures in tests/fixtures/gpt2_tiny_torch/.

What it writes (all float32 / int32, CPU, deterministic):
  config.json, model.safetensors  tiny GPT-2 (HF names, Conv1D weights [in, out], lm_head
                                  tied to transformer.wte.weight and therefore not stored)
  batch.safetensors               tokens, targets: int32 [B, T] (llm.c convention: one flat
                                  sequence of B*T+1 tokens, targets = inputs shifted by one)
  expected.safetensors            logits [B, T, V], loss [], grad.<param name> for every
                                  parameter, losses_adamw [4] (loss before step 1, 2, 3 and
                                  after step 3 of AdamW on the same batch)
  README.md                       provenance and how to regenerate

Run from the repository root (uses the tools venv, not the repo):
  /opt/torchenv/bin/python tools/make_gpt2_fixtures.py
  /opt/torchenv/bin/python tools/make_gpt2_fixtures.py --out /tmp/fx   # elsewhere

vocab_size is 250 on purpose: memfit pads the embedding table to a multiple of 64 rows, and
the tests must show that padding never leaks into logits, loss or gradients.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from fixture_common import make_batch, reference_values


def parse_args():
    repo_root = Path(__file__).resolve().parent.parent
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=repo_root / "tests" / "fixtures" / "gpt2_tiny_torch")
    p.add_argument("--seed", type=int, default=1234, help="seed for the model weights")
    p.add_argument("--data-seed", type=int, default=4321, help="seed for the token batch")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--n-positions", type=int, default=64)
    p.add_argument("--vocab", type=int, default=250)
    p.add_argument("--adamw-steps", type=int, default=3)
    p.add_argument("--perturb-std", type=float, default=0.05,
                   help="std of seeded noise added to biases and LayerNorm weights/biases, whose HF "
                        "default init (0 and 1) would hide a missing bias add or a swapped "
                        "LayerNorm weight/bias; 0 keeps the plain HF init")
    return p.parse_args()


def build_model(args):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
        n_positions=args.n_positions, vocab_size=args.vocab,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=1e-5, use_cache=False,
        # GPT-2's 50256 is outside a 250-token vocabulary; no special tokens are needed here.
        bos_token_id=None, eos_token_id=None,
    )
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel._from_config(config, attn_implementation="eager", dtype=torch.float32)
    if args.perturb_std > 0:
        gen = torch.Generator().manual_seed(args.seed + 1)
        with torch.no_grad():
            for _, p in model.named_parameters():
                if p.ndim < 2:
                    p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * args.perturb_std)
    model.train()  # dropout probabilities are 0, so train() == eval() numerically
    assert model.config._attn_implementation == "eager"
    assert model.lm_head.weight is model.transformer.wte.weight, "lm_head must be tied to wte"
    return model


def check_saved_model(out, model, param_names):
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        expected = set(param_names)
        if keys != expected:
            sys.exit(f"model.safetensors keys differ: missing {sorted(expected - keys)}, "
                     f"extra {sorted(keys - expected)}")
        params = dict(model.named_parameters())
        for k in sorted(keys):
            t = f.get_tensor(k)
            if t.dtype != torch.float32 or not torch.equal(t, params[k].detach()):
                sys.exit(f"model.safetensors: {k} does not round-trip")
    print(f"model.safetensors: {len(keys)} keys, all equal to the model's parameters; "
          f"no lm_head.weight (tied)")


def main():
    args = parse_args()
    torch.set_num_threads(1)  # single-threaded reductions: same bits on every run
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)

    import safetensors
    import transformers

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "generation_config.json",
                 "batch.safetensors", "expected.safetensors", "README.md"):
        (out / name).unlink(missing_ok=True)

    model = build_model(args)
    param_names = [n for n, _ in model.named_parameters()]

    model.save_pretrained(out, safe_serialization=True)
    for extra in sorted(set(os.listdir(out)) - {"config.json", "model.safetensors"}):
        (out / extra).unlink()
    check_saved_model(out, model, param_names)

    # The reloaded model must give the same logits (guards against tie/naming surprises).
    tokens, targets = make_batch(args.batch, args.seq, args.vocab, args.data_seed)
    from transformers import GPT2LMHeadModel
    reloaded = GPT2LMHeadModel.from_pretrained(out, attn_implementation="eager", dtype=torch.float32)

    # One metadata key only: safetensors writes metadata in hash order, so several keys
    # would make the files differ byte-wise between runs.
    meta = {"source": f"tools/make_gpt2_fixtures.py torch={torch.__version__} "
                      f"transformers={transformers.__version__} seed={args.seed} "
                      f"data_seed={args.data_seed} perturb_std={args.perturb_std}"}
    save_file({"tokens": tokens.to(torch.int32).contiguous(),
               "targets": targets.to(torch.int32).contiguous()},
              str(out / "batch.safetensors"), metadata=meta)

    with torch.no_grad():
        rl = reloaded(input_ids=tokens).logits
    del reloaded
    expected = reference_values(model, tokens, targets, args.adamw_steps)
    if not torch.equal(rl, expected["logits"]):
        sys.exit("reloaded model gives different logits")
    loss, losses = expected["loss"], expected["losses_adamw"]
    save_file(expected, str(out / "expected.safetensors"), metadata=meta)

    B, T, V = args.batch, args.seq, args.vocab
    readme = f"""# gpt2_tiny_torch

Reference values from PyTorch {torch.__version__} + transformers {transformers.__version__} (safetensors {safetensors.__version__}), float32, CPU, 1 thread, deterministic algorithms, made by `tools/make_gpt2_fixtures.py`.
`config.json` + `model.safetensors`: HF `GPT2LMHeadModel` (n_layer={args.n_layer}, n_head={args.n_head}, n_embd={args.n_embd}, n_positions={args.n_positions}, vocab_size={V}, gelu_new, eager attention), seed {args.seed}, HF init plus N(0, {args.perturb_std}) noise on biases and LayerNorm params; Conv1D weights are [in, out]; `lm_head` is tied to `transformer.wte.weight` and not stored.
`batch.safetensors`: `tokens`, `targets` int32 [{B}, {T}], from one flat random sequence of B*T+1 tokens (seed {args.data_seed}); row b = flat[b*T : b*T+T], targets = flat[b*T+1 : b*T+T+1].
`expected.safetensors`: `logits` [{B}, {T}, {V}], `loss` [] (mean cross-entropy over all B*T tokens), `grad.<param name>` for every parameter (`grad.transformer.wte.weight` includes the tied lm_head's share), `losses_adamw` [{args.adamw_steps + 1}] (AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1 on ndim>=2 params else 0: loss before each step, then after the last).
Regenerate from the repository root: `/opt/torchenv/bin/python tools/make_gpt2_fixtures.py` (bit-identical on the same torch/transformers versions).
"""
    (out / "README.md").write_text(readme)

    print(f"loss = {loss.item():.6f}   (ln V = {torch.log(torch.tensor(float(V))).item():.6f})")
    print("losses_adamw =", [round(x, 6) for x in losses.tolist()])
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    total = 0
    for name in sorted(os.listdir(out)):
        size = (out / name).stat().st_size
        total += size
        print(f"  {size:>9,d}  {name}")
    print(f"  {total:>9,d}  total bytes ({total / 2**20:.3f} MiB) in {out}")
    with open(out / "config.json") as f:
        cfg = json.load(f)
    print("config.json:", {k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size",
                                               "activation_function", "layer_norm_epsilon",
                                               "tie_word_embeddings") if k in cfg})


if __name__ == "__main__":
    main()
