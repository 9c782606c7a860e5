#!/usr/bin/env python3
"""Regenerate the PyTorch reference fixtures in tests/fixtures/llama_tiny_torch/ (and, with
--family qwen2, tests/fixtures/qwen2_tiny_torch/: biases on q, k and v, tied embeddings).

What it writes (all float32 / int32, CPU, deterministic):
  config.json, model.safetensors  tiny LlamaForCausalLM (HF names; grouped-query attention with
                                  4 query heads and 2 key/value heads; untied lm_head)
  batch.safetensors               tokens, targets: int32 [B, T] (llm.c convention: one flat
                                  sequence of B*T+1 tokens, targets = inputs shifted by one)
  expected.safetensors            logits [B, T, V], loss [], grad.<param name> for every
                                  parameter, losses_adamw [4] (loss before step 1, 2, 3 and
                                  after step 3 of AdamW on the same batch)
  README.md                       provenance and how to regenerate

Run from the repository root (uses the tools venv, not the repo):
  /opt/torchenv/bin/python tools/make_llama_fixtures.py
  /opt/torchenv/bin/python tools/make_llama_fixtures.py --family qwen2

vocab_size is 250 (memfit pads tables to 256 rows: padding must never leak), intermediate_size
172 (not a multiple of 16: ragged vector tails), and the RMSNorm weights get seeded noise (HF
initialises them to 1, which would hide a norm that ignores its weight).
"""

import argparse
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
    p.add_argument("--family", choices=("llama", "qwen2"), default="llama")
    p.add_argument("--out", type=Path, default=None, help="default tests/fixtures/<family>_tiny_torch")
    p.add_argument("--seed", type=int, default=1234, help="seed for the model weights")
    p.add_argument("--data-seed", type=int, default=4321, help="seed for the token batch")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--hidden", type=int, default=None, help="default 64 (llama), 32 (qwen2)")
    p.add_argument("--intermediate", type=int, default=None, help="default 172 (llama), 72 (qwen2)")
    p.add_argument("--positions", type=int, default=64)
    p.add_argument("--vocab", type=int, default=250)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--rope-scaling", choices=("none", "llama3"), default="none",
                   help="llama3: Llama 3.1's frequency scaling (factor 8, low 1, high 4) over an original context "
                        "of half the batch's sequence, so positions beyond it occur")
    p.add_argument("--adamw-steps", type=int, default=3)
    p.add_argument("--perturb-std", type=float, default=0.1,
                   help="std of seeded noise on the RMSNorm weights and q/k/v biases (HF starts them at 1 and 0)")
    args = p.parse_args()
    qwen2 = args.family == "qwen2"
    args.hidden = args.hidden or (32 if qwen2 else 64)
    args.intermediate = args.intermediate or (72 if qwen2 else 172)
    name = "llama31" if args.rope_scaling == "llama3" else args.family
    args.out = args.out or repo_root / "tests" / "fixtures" / f"{name}_tiny_torch"
    return args


def rope_parameters(args):
    if args.rope_scaling == "none":
        return {"rope_type": "default", "rope_theta": args.rope_theta}
    return {"rope_type": "llama3", "rope_theta": args.rope_theta, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": args.seq // 2}


def inv_freq_tables(model):
    """transformers' inverse frequencies: the tiny model's, and Llama 3.1 8B's (head_dim 128)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    rope = model.config.rope_parameters
    tables = {"inv_freq": ROPE_INIT_FUNCTIONS[rope["rope_type"]](model.config, "cpu")[0]
              if rope["rope_type"] != "default" else model.model.rotary_emb.inv_freq.clone()}
    if rope["rope_type"] == "llama3":
        big = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                          max_position_embeddings=131072,
                          rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 8192})
        tables["inv_freq.llama31_8b"] = ROPE_INIT_FUNCTIONS["llama3"](big, "cpu")[0]
    assert torch.equal(tables["inv_freq"], model.model.rotary_emb.inv_freq), "the model rotates with another table"
    return {k: v.contiguous() for k, v in tables.items()}


def build_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        hidden_size=args.hidden, intermediate_size=args.intermediate, max_position_embeddings=args.positions,
        vocab_size=args.vocab, rms_norm_eps=args.eps, hidden_act="silu",
        attention_dropout=0.0, use_cache=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    common["rope_parameters"] = rope_parameters(args)
    if args.family == "qwen2":
        config, cls = Qwen2Config(tie_word_embeddings=True, use_sliding_window=False, **common), Qwen2ForCausalLM
    else:
        config = LlamaConfig(attention_bias=False, mlp_bias=False, tie_word_embeddings=False, **common)
        cls = LlamaForCausalLM
    torch.manual_seed(args.seed)
    model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    if args.perturb_std > 0:
        gen = torch.Generator().manual_seed(args.seed + 1)
        with torch.no_grad():
            for _, p in model.named_parameters():
                if p.ndim < 2:
                    p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * args.perturb_std)
    model.train()
    assert model.config._attn_implementation == "eager"
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == (args.family == "qwen2"), "llama: untied lm_head; qwen2: tied"
    return model


def main():
    args = parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)

    import safetensors
    import transformers
    from transformers import AutoModelForCausalLM

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(out):
        (out / name).unlink()

    model = build_model(args)
    param_names = [n for n, _ in model.named_parameters()]
    model.save_pretrained(out, safe_serialization=True)
    for extra in sorted(set(os.listdir(out)) - {"config.json", "model.safetensors"}):
        (out / extra).unlink()
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        if set(f.keys()) != set(param_names):
            sys.exit(f"model.safetensors keys differ from the parameters: {sorted(set(f.keys()) ^ set(param_names))}")

    tokens, targets = make_batch(args.batch, args.seq, args.vocab, args.data_seed)
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32)
    meta = {"source": f"tools/make_llama_fixtures.py torch={torch.__version__} "
                      f"transformers={transformers.__version__} seed={args.seed} data_seed={args.data_seed} "
                      f"perturb_std={args.perturb_std}"}
    save_file({"tokens": tokens.to(torch.int32).contiguous(), "targets": targets.to(torch.int32).contiguous()},
              str(out / "batch.safetensors"), metadata=meta)

    with torch.no_grad():
        rl = reloaded(input_ids=tokens).logits
    del reloaded
    expected = reference_values(model, tokens, targets, args.adamw_steps)
    if not torch.equal(rl, expected["logits"]):
        sys.exit("reloaded model gives different logits")
    expected.update(inv_freq_tables(model))
    loss, losses = expected["loss"], expected["losses_adamw"]
    save_file(expected, str(out / "expected.safetensors"), metadata=meta)

    B, T, V = args.batch, args.seq, args.vocab
    (out / "README.md").write_text(f"""# {out.name}

Reference values from PyTorch {torch.__version__} + transformers {transformers.__version__} (safetensors {safetensors.__version__}), float32, CPU, 1 thread, deterministic algorithms, made by `tools/make_llama_fixtures.py`.
`config.json` + `model.safetensors`: HF `{type(model).__name__}` (layers={args.layers}, heads={args.heads}, kv_heads={args.kv_heads}, hidden={args.hidden}, intermediate={args.intermediate}, positions={args.positions}, vocab={V}, rope_theta={args.rope_theta}, rms_norm_eps={args.eps}, {"tied embeddings and q/k/v biases" if args.family == "qwen2" else "untied lm_head"}, eager attention), seed {args.seed}, HF init plus N(0, {args.perturb_std}) noise on the RMSNorm weights{" and biases" if args.family == "qwen2" else ""}.
`batch.safetensors`: `tokens`, `targets` int32 [{B}, {T}], from one flat random sequence of B*T+1 tokens (seed {args.data_seed}).
`expected.safetensors`: `logits` [{B}, {T}, {V}], `loss` [] (mean cross-entropy over all B*T tokens), `grad.<param name>` for every parameter, `losses_adamw` [{args.adamw_steps + 1}] (AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1 on ndim>=2 params else 0: loss before each step, then after the last).
Rotary embedding: {rope_parameters(args)}; `expected.safetensors` also holds transformers' `inv_freq` table{" and that of Llama 3.1 8B (`inv_freq.llama31_8b`, head_dim 128, theta 5e5, llama3 scaling over 8192 positions)" if args.rope_scaling == "llama3" else ""}.
Regenerate from the repository root: `/work/venv/bin/python tools/make_llama_fixtures.py --family {args.family}{" --rope-scaling llama3 --hidden 32 --intermediate 72 --rope-theta 500000" if args.rope_scaling == "llama3" else ""}`.
""")
    print(f"loss = {loss.item():.6f}   losses_adamw = {[round(x, 6) for x in losses.tolist()]}")
    total = sum((out / n).stat().st_size for n in os.listdir(out))
    print(f"{total:,d} bytes in {out}")


if __name__ == "__main__":
    main()
