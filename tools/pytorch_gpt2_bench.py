#!/usr/bin/env python3
"""PyTorch eager side of memfit's GPT-2 training-step benchmark.

Times full training steps of a randomly initialised transformers GPT-2 on the CPU:
forward, mean cross-entropy over all B*T tokens (logits vs next tokens), backward,
AdamW(lr=3e-4) step, zero_grad(set_to_none=True). Run it next to memfit on the same
machine, same model, batch, sequence length and thread count.

  /opt/torchenv/bin/python tools/pytorch_gpt2_bench.py --model gpt2 --batch 4 --seq 256 \
      --steps 3 --warmup 1 --threads 2 --precision fp32 --json

--steps counts the timed steps; --warmup steps run before them and are not timed
(the first step also allocates AdamW state). Throughput uses only the timed steps.
GFLOP/s is 6 * N * tokens / time (N = unique parameters, tied lm_head counted once;
attention score FLOPs are not included), the usual convention for comparing trainers.
Peak RSS is the process high-water mark (ru_maxrss), model construction included;
rss_before_model_bytes is the RSS after importing torch/transformers (not the model's).

Environment: BLAS/OpenMP variables are printed, never changed, except that --clean-env
re-executes this script once without OPENBLAS_CORETYPE (it can slow PyTorch down here).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

MODELS = {
    # name: (n_layer, n_head, n_embd, vocab_size, n_positions)
    "gpt2-tiny": (2, 4, 64, 250, 64),
    "gpt2": (12, 12, 768, 50257, 1024),
    "gpt2-medium": (24, 16, 1024, 50257, 1024),
    "gpt2-large": (36, 20, 1280, 50257, 1024),
    "gpt2-xl": (48, 25, 1600, 50257, 1024),
}

ENV_PREFIXES = ("OPENBLAS", "GOTO", "MKL", "OMP", "KMP", "BLIS", "NVPL", "ONEDNN", "DNNL",
                "ATEN", "TORCH_CPU", "LD_PRELOAD", "MALLOC", "GOMP")
LLMC_MAGIC = {20240520: ("gpt-2", "<u2"), 20240801: ("llama-3", "<u4")}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2", choices=sorted(MODELS))
    p.add_argument("--config", default=None,
                   help="an HF config.json (any causal LM transformers builds, e.g. Llama) instead of --model")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before the timed ones")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                   help="bf16: torch.autocast('cpu', bfloat16) around forward+loss; params stay fp32")
    p.add_argument("--data", default=None, help="llm.c token file (.bin); default: random tokens")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--attn", default=None,
                   help="attn_implementation to force (eager, sdpa); default: what transformers picks")
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    p.add_argument("--clean-env", action="store_true",
                   help="re-execute without OPENBLAS_CORETYPE if it is set")
    return p.parse_args()


def blas_env():
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def maybe_reexec_clean(args):
    if args.clean_env and "OPENBLAS_CORETYPE" in os.environ:
        env = dict(os.environ)
        removed = env.pop("OPENBLAS_CORETYPE")
        print(f"--clean-env: re-executing without OPENBLAS_CORETYPE={removed}", file=sys.stderr, flush=True)
        os.execve(sys.executable, [sys.executable] + sys.argv, env)


def rss_now_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load_llmc_tokens(path):
    import numpy as np

    header = np.fromfile(path, dtype="<i4", count=256)
    if header.size != 256 or int(header[0]) not in LLMC_MAGIC:
        sys.exit(f"{path}: not an llm.c token file (bad magic)")
    _, dtype = LLMC_MAGIC[int(header[0])]
    n = int(header[2])
    tokens = np.fromfile(path, dtype=dtype, count=n, offset=256 * 4)
    if tokens.size != n:
        sys.exit(f"{path}: header says {n} tokens, file holds {tokens.size}")
    return tokens.astype(np.int64)


def make_batches(args, vocab, n_batches):
    """n_batches (inputs, targets) pairs of [B, T] int64, llm.c style: each batch is a
    contiguous run of B*T+1 tokens, targets shifted by one; consecutive batches advance B*T."""
    import torch

    B, T = args.batch, args.seq
    need = B * T + 1
    if args.data:
        flat_all = torch.from_numpy(load_llmc_tokens(args.data))
        if flat_all.numel() < need:
            sys.exit(f"{args.data}: {flat_all.numel()} tokens, need at least {need}")
        if int(flat_all.max()) >= vocab:
            sys.exit(f"{args.data}: token id {int(flat_all.max())} >= vocab {vocab}")
    else:
        gen = torch.Generator().manual_seed(args.seed + 1)
        flat_all = torch.randint(0, vocab, (B * T * n_batches + 1,), generator=gen)
    batches, pos = [], 0
    for _ in range(n_batches):
        if pos + need > flat_all.numel():
            pos = 0
        chunk = flat_all[pos: pos + need]
        batches.append((chunk[:-1].view(B, T).clone(), chunk[1:].view(B, T).clone()))
        pos += B * T
    return batches


def main():
    args = parse_args()
    maybe_reexec_clean(args)

    env = blas_env()
    for k, v in env.items():
        print(f"env: {k}={v}", file=sys.stderr)
    if "OPENBLAS_CORETYPE" in env:
        print("warning: OPENBLAS_CORETYPE is set and can slow PyTorch down; "
              "--clean-env re-runs without it", file=sys.stderr)

    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.config:
        from transformers import AutoConfig, AutoModelForCausalLM
        config = AutoConfig.from_pretrained(args.config)
        config.use_cache = False
        vocab, n_pos = config.vocab_size, config.max_position_embeddings
        args.model = args.config
    else:
        n_layer, n_head, n_embd, vocab, n_pos = MODELS[args.model]
        config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab,
                            n_positions=n_pos, activation_function="gelu_new", resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, use_cache=False)
        if vocab <= 50256:  # GPT-2's bos/eos id 50256 is outside a small vocabulary
            config.bos_token_id = config.eos_token_id = None
    if args.seq > n_pos:
        sys.exit(f"--seq {args.seq} exceeds the context length {n_pos} of {args.model}")
    rss_base = rss_now_bytes()
    t0 = time.perf_counter()
    if args.config:
        model = AutoModelForCausalLM.from_config(config, **({"attn_implementation": args.attn} if args.attn else {}))
    elif args.attn:
        model = GPT2LMHeadModel._from_config(config, attn_implementation=args.attn)
    else:
        model = GPT2LMHeadModel(config)
    model.train()
    init_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())  # tied lm_head counted once
    attn_impl = model.config._attn_implementation

    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    batches = make_batches(args, vocab, args.warmup + args.steps)
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16"
                else torch.autocast("cpu", enabled=False))

    times, losses = [], []
    for i, (x, y) in enumerate(batches):
        t = time.perf_counter()
        with autocast:
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        dt = time.perf_counter() - t
        losses.append(loss_value)
        tag = "warmup" if i < args.warmup else "step"
        if i >= args.warmup:
            times.append(dt)
        print(f"{tag} {i}: loss {loss_value:.4f}  {dt * 1e3:.1f} ms", file=sys.stderr, flush=True)

    tokens_per_step = args.batch * args.seq
    mean_s = statistics.mean(times) if times else float("nan")
    median_s = statistics.median(times) if times else float("nan")
    result = {
        "tool": "pytorch_gpt2_bench",
        "model": args.model,
        "n_params": n_params,
        "batch": args.batch,
        "seq": args.seq,
        "precision": args.precision,
        "threads": torch.get_num_threads(),
        "warmup": args.warmup,
        "steps": len(times),
        "attn_implementation": attn_impl,
        "data": args.data or "random",
        "ms_per_step_mean": mean_s * 1e3,
        "ms_per_step_median": median_s * 1e3,
        "ms_per_step_all": [round(t * 1e3, 2) for t in times],
        "tokens_per_s": tokens_per_step / mean_s,
        "gflops_per_s": 6 * n_params * tokens_per_step / mean_s / 1e9,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_before_model_bytes": rss_base,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "init_s": init_s,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "blas_env": env,
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for k, v in result.items():
            print(f"{k:>20}: {v}")


if __name__ == "__main__":
    main()
