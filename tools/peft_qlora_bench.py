#!/usr/bin/env python3
"""PyTorch + peft + bitsandbytes side of memfit's QLoRA benchmark (bench/qlora_tinyllama.sh).

Times QLoRA training steps on the CPU the way the QLoRA paper's qlora.py sets them up:
- the base model is loaded with from_pretrained and a BitsAndBytesConfig (NF4, double
  quantisation, bf16 compute), so the linear layers are quantised while the checkpoint loads;
- prepare_model_for_kbit_training with gradient checkpointing (use_reentrant=False);
- LoRA (peft LoraConfig, target_modules="all-linear", which leaves lm_head out; --dora: DoRA);
- then, as qlora.py does under --bf16, embeddings and lm_head back to bf16 and norms in fp32
  (--kbit-prep peft keeps what prepare_model_for_kbit_training leaves: them all in fp32);
- forward and loss under torch.autocast('cpu', bfloat16) (what the HF Trainer does with bf16=True),
  backward, AdamW(lr) over the adapters, zero_grad(set_to_none=True).

The base weights are random: --checkpoint names a directory holding a bf16 safetensors
checkpoint of --config; a missing one is written first by a child process, so its memory is not
this process's. Tokens come from --data (an llm.c .bin file, as memfit reads it), batches in
the same order as memfit without shuffling: contiguous runs of B*T+1 tokens advancing by B*T.

  /work/venv/bin/python tools/peft_qlora_bench.py --config DIR/config.json --checkpoint DIR/ckpt \
      --data DIR/tokens.bin --batch 4 --seq 256 --warmup 1 --steps 2 --threads 2 --json

Peak RSS is the process high-water mark (ru_maxrss), loading and quantisation included;
peak_rss_steps_bytes is the high-water mark of the steps alone (reset through
/proc/self/clear_refs after loading), rss_after_load_bytes the resident set before step 1.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

LLMC_MAGIC = {20240520: "<u2", 20240801: "<u4"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="HF config.json of the model")
    p.add_argument("--checkpoint", required=True, help="directory of the random bf16 base checkpoint")
    p.add_argument("--data", required=True, help="llm.c token file (.bin)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=2, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before the timed ones")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=8.0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--kbit-prep", default="qlora", choices=("qlora", "peft"))
    p.add_argument("--dora", action="store_true", help="LoraConfig(use_dora=True): QDoRA")
    p.add_argument("--lora-dropout", type=float, default=0.0, help="LoraConfig(lora_dropout=P)")
    p.add_argument("--make-checkpoint", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    return p.parse_args()


def rss_now_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def hwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def make_checkpoint(args):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(args.seed)
    config = AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(args.config)))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(args.checkpoint)


def ensure_checkpoint(args):
    if os.path.exists(os.path.join(args.checkpoint, "config.json")):
        return
    t = time.perf_counter()
    subprocess.run([sys.executable, os.path.abspath(__file__), "--make-checkpoint"] + sys.argv[1:], check=True)
    print(f"wrote the random bf16 checkpoint {args.checkpoint} in {time.perf_counter() - t:.1f} s",
          file=sys.stderr, flush=True)


def load_batches(args, n_batches):
    import numpy as np
    import torch

    header = np.fromfile(args.data, dtype="<i4", count=256)
    if header.size != 256 or int(header[0]) not in LLMC_MAGIC:
        sys.exit(f"{args.data}: not an llm.c token file (bad magic)")
    n = int(header[2])
    tokens = torch.from_numpy(np.fromfile(args.data, dtype=LLMC_MAGIC[int(header[0])], count=n,
                                          offset=256 * 4).astype(np.int64))
    B, T = args.batch, args.seq
    need = B * T + 1
    if tokens.numel() < need:
        sys.exit(f"{args.data}: {tokens.numel()} tokens, need at least {need}")
    batches, pos = [], 0
    for _ in range(n_batches):
        if pos + need > tokens.numel():
            pos = 0
        chunk = tokens[pos: pos + need]
        batches.append((chunk[:-1].view(B, T).clone(), chunk[1:].view(B, T).clone()))
        pos += B * T
    return batches


def build_model(args):
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, quantization_config=bnb, dtype=torch.bfloat16,
                                                 device_map="cpu")
    model.config.use_cache = False
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                            gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=args.lora_dropout, target_modules="all-linear",
                      bias="none", task_type="CAUSAL_LM", use_dora=args.dora)
    model = get_peft_model(model, lora)
    if args.kbit_prep == "qlora":  # qlora.py under --bf16
        for name, module in model.named_modules():
            if "norm" in name:
                module.to(torch.float32)
            if ("lm_head" in name or "embed_tokens" in name) and getattr(module, "weight", None) is not None \
                    and module.weight.dtype == torch.float32:
                module.to(torch.bfloat16)
    model.train()
    return model


def run_steps(args, model):
    import torch
    import torch.nn.functional as F

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr)
    batches = load_batches(args, args.warmup + args.steps)
    times, losses = [], []
    for i, (x, y) in enumerate(batches):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        dt = time.perf_counter() - t
        losses.append(loss_value)
        if i >= args.warmup:
            times.append(dt)
        tag = "warmup" if i < args.warmup else "step"
        print(f"{tag} {i}: loss {loss_value:.4f}  {dt:.2f} s", file=sys.stderr, flush=True)
    return times, losses, sum(p.numel() for p in params)


def main():
    args = parse_args()
    if args.make_checkpoint:
        make_checkpoint(args)
        return
    ensure_checkpoint(args)

    import bitsandbytes
    import peft
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = build_model(args)
    load_s = time.perf_counter() - t0
    rss_loaded = rss_now_bytes()
    peak_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:  # resets VmHWM (Linux >= 4.0), so the steps' own high-water mark can be read
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        steps_hwm_ok = True
    except OSError:
        steps_hwm_ok = False
    times, losses, n_trainable = run_steps(args, model)

    tokens_per_step = args.batch * args.seq
    mean_s = statistics.mean(times) if times else float("nan")
    n_4bit = sum(1 for m in model.modules() if m.__class__.__name__ == "Linear4bit")
    result = {
        "tool": "peft_qlora_bench",
        "config": args.config,
        "batch": args.batch,
        "seq": args.seq,
        "rank": args.rank,
        "alpha": args.alpha,
        "kbit_prep": args.kbit_prep,
        "threads": torch.get_num_threads(),
        "warmup": args.warmup,
        "steps": len(times),
        "n_trainable": n_trainable,
        "n_linear4bit": n_4bit,
        "s_per_step_mean": mean_s,
        "s_per_step_median": statistics.median(times) if times else float("nan"),
        "s_per_step_all": [round(t, 3) for t in times],
        "tokens_per_s": tokens_per_step / mean_s,
        "peak_rss_bytes": max(peak_load, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        "peak_rss_load_bytes": peak_load,
        "peak_rss_steps_bytes": hwm_bytes() if steps_hwm_ok else None,
        "rss_after_load_bytes": rss_loaded,
        "load_s": load_s,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "bitsandbytes": bitsandbytes.__version__,
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for k, v in result.items():
            print(f"{k:>22}: {v}")


if __name__ == "__main__":
    main()
