#!/usr/bin/env python3
"""Summarises bench/qlora_tinyllama.sh: memfit QLoRA against PyTorch + peft + bitsandbytes.

  summarize_qlora_bench.py OUT_DIR ROUNDS

Reads OUT_DIR/{memfit-R.json, memfit-time-R.txt, torch-R.json} for R in 1..ROUNDS and
plan-full.json / plan-qlora.json, and prints a markdown table with the ratios of each round
(both sides of a round ran back to back, so they saw the same machine load).
"""

import json
import os
import re
import statistics
import sys

GIB = 1 << 30


def gib(b):
    return f"{b / GIB:.2f} GiB"


def time_v_peak(path):
    with open(path) as f:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", f.read())
    return int(m.group(1)) * 1024 if m else None


def main():
    out, rounds = sys.argv[1], int(sys.argv[2])
    load = lambda name: json.load(open(os.path.join(out, name)))
    full, qplan = load("plan-full.json"), load("plan-qlora.json")
    hw = qplan["estimate"]["hardware"]
    rows = []
    for r in range(1, rounds + 1):
        m, t = load(f"memfit-{r}.json"), load(f"torch-{r}.json")
        mem = m["memory"]
        rows.append({
            "m_tps": m["tokens_per_second"], "t_tps": t["tokens_per_s"],
            "m_ms": m["ms_per_step"], "t_ms": t["s_per_step_mean"] * 1e3,
            "m_rss": time_v_peak(os.path.join(out, f"memfit-time-{r}.txt")), "t_rss": t["peak_rss_bytes"],
            "t_rss_steps": t["peak_rss_steps_bytes"], "t_rss_loaded": t["rss_after_load_bytes"],
            "planned": mem["planned_peak_bytes"]["device"], "measured": mem["measured_peak_bytes"]["device"],
            "flops": m["flops_per_step"], "phases": m["ms_per_step_by_phase"],
            "m_loss": m["loss"]["first"], "t_loss": t["loss_first"],
        })
    med = lambda k: statistics.median(row[k] for row in rows)
    print(f"| | memfit | PyTorch + peft + bnb | memfit / PyTorch |")
    print("|---|---|---|---|")
    for i, row in enumerate(rows, 1):
        print(f"| round {i}: s/step | {row['m_ms'] / 1e3:.2f} | {row['t_ms'] / 1e3:.2f} | "
              f"**{row['t_ms'] / row['m_ms']:.2f}x** tokens/s |")
        print(f"| round {i}: peak RSS | {gib(row['m_rss'])} | {gib(row['t_rss'])} "
              f"(steps alone {gib(row['t_rss_steps'])}, after loading {gib(row['t_rss_loaded'])}) | "
              f"**{row['m_rss'] / row['t_rss']:.2f}x** |")
    print(f"| tokens/s (median) | {med('m_tps'):.1f} | {med('t_tps'):.1f} | {med('m_tps') / med('t_tps'):.2f}x |")
    bf16 = hw["peak_bf16_flops"]
    print(f"| model GFLOP/s (memfit's FLOPs per step, recompute included) | {med('flops') / med('m_ms') / 1e6:.0f} "
          f"| {med('flops') / med('t_ms') / 1e6:.0f} | |")
    print(f"| share of the probed bf16 product peak ({bf16 / 1e9:.0f} GFLOP/s) | "
          f"{100 * med('flops') / (med('m_ms') / 1e3) / bf16:.0f}% | {100 * med('flops') / (med('t_ms') / 1e3) / bf16:.0f}% | |")
    r0 = rows[0]
    eq = "equal" if all(row["planned"] == row["measured"] for row in rows) else "DIFFERENT"
    print(f"| memfit device peak, planned / measured | {r0['planned']:,} B ({gib(r0['planned'])}) / "
          f"{r0['measured']:,} B: {eq} | | |")
    print(f"| first loss (random init, each side its own) | {r0['m_loss']:.4f} | {r0['t_loss']:.4f} | |")
    print()
    fb = full["estimate"]["per_rank"]["device_bytes"]
    print(f"Full fine-tune, planned by memfit (fp32 AdamW, no recompute, same shape): {fb:,} B ({gib(fb)}); "
          f"memfit's QLoRA peak RSS is {100 * r0['m_rss'] / fb:.1f}% of it.")
    print(f"Probed peaks (memfit plan --hardware cpu): fp32 products {hw['peak_fp32_flops'] / 1e9:.0f} GFLOP/s, "
          f"bf16 {bf16 / 1e9:.0f} GFLOP/s, streaming {hw['memory_bandwidth'] / 1e9:.1f} GB/s.")
    print("memfit phases, ms (round 1): " + ", ".join(f"{k} {v:.0f}" for k, v in r0["phases"].items()))


if __name__ == "__main__":
    main()
