#!/usr/bin/env python3
"""Summarises bench/qlora_tinyllama.sh: memfit QLoRA against PyTorch + peft + bitsandbytes.

  summarize_qlora_bench.py OUT_DIR ROUNDS

Reads OUT_DIR/{memfit-MODE-R.json, memfit-MODE-time-R.txt, memfit-MODE-R.log, torch-R.json}
for R in 1..ROUNDS and MODE in full (PyTorch's recomputation: every block) and auto (memfit's
choice under --memory-budget), and plan-full.json / plan-qlora.json, and prints a markdown
table with the ratios of each round (the three runs of a round ran back to back, so they saw
the same machine load).
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
    def memfit_run(mode, r):
        m = load(f"memfit-{mode}-{r}.json")
        mem = m["memory"]
        with open(os.path.join(out, f"memfit-{mode}-{r}.log")) as f:
            choice = re.search(r"^recompute auto: (.*?) \(", f.read(), re.M)
        return {"tps": m["tokens_per_second"], "ms": m["ms_per_step"],
                "rss": time_v_peak(os.path.join(out, f"memfit-{mode}-time-{r}.txt")),
                "planned": mem["planned_peak_bytes"]["device"], "measured": mem["measured_peak_bytes"]["device"],
                "flops": m["flops_per_step"], "phases": m["ms_per_step_by_phase"], "loss": m["loss"]["first"],
                "choice": choice.group(1) if choice else "full"}

    rows = []
    for r in range(1, rounds + 1):
        t = load(f"torch-{r}.json")
        rows.append({"full": memfit_run("full", r), "auto": memfit_run("auto", r),
                     "t_tps": t["tokens_per_s"], "t_ms": t["s_per_step_mean"] * 1e3, "t_rss": t["peak_rss_bytes"],
                     "t_rss_steps": t["peak_rss_steps_bytes"], "t_rss_loaded": t["rss_after_load_bytes"],
                     "t_loss": t["loss_first"]})
    med = lambda f: statistics.median(f(row) for row in rows)
    bf16 = hw["peak_bf16_flops"]
    print("| | memfit, every block recomputed | memfit, `--recompute auto` | PyTorch + peft + bnb (gradient checkpointing) |")
    print("|---|---|---|---|")
    for i, row in enumerate(rows, 1):
        f, a = row["full"], row["auto"]
        print(f"| round {i}: s/step | {f['ms'] / 1e3:.2f} (**{row['t_ms'] / f['ms']:.2f}x** PyTorch's tokens/s) | "
              f"{a['ms'] / 1e3:.2f} (**{row['t_ms'] / a['ms']:.2f}x**) | {row['t_ms'] / 1e3:.2f} |")
        print(f"| round {i}: peak RSS | {gib(f['rss'])} (**{f['rss'] / row['t_rss']:.2f}x** PyTorch's) | "
              f"{gib(a['rss'])} (**{a['rss'] / row['t_rss']:.2f}x**) | {gib(row['t_rss'])} (steps alone "
              f"{gib(row['t_rss_steps'])}, after loading {gib(row['t_rss_loaded'])}) |")
    print(f"| tokens/s (median) | {med(lambda r: r['full']['tps']):.1f} | {med(lambda r: r['auto']['tps']):.1f} | "
          f"{med(lambda r: r['t_tps']):.1f} |")
    gflops = lambda mode: med(lambda r: r[mode]["flops"] / r[mode]["ms"] / 1e6)
    t_gflops = med(lambda r: r["full"]["flops"] / r["t_ms"] / 1e6)
    print(f"| model GFLOP/s (memfit's FLOPs of the run, recompute included) | {gflops('full'):.0f} | {gflops('auto'):.0f} "
          f"| {t_gflops:.0f} (with the full run's FLOPs) |")
    print(f"| share of the probed bf16 product peak ({bf16 / 1e9:.0f} GFLOP/s) | {100 * gflops('full') * 1e9 / bf16:.0f}% | "
          f"{100 * gflops('auto') * 1e9 / bf16:.0f}% | {100 * t_gflops * 1e9 / bf16:.0f}% |")
    for mode in ("full", "auto"):
        eq = "equal" if all(r[mode]["planned"] == r[mode]["measured"] for r in rows) else "DIFFERENT"
        r0 = rows[0][mode]
        print(f"| memfit device peak ({mode}), planned / measured | {r0['planned']:,} B ({gib(r0['planned'])}) / "
              f"{r0['measured']:,} B: {eq} | | |")
    print(f"| recomputation | every block | {rows[0]['auto']['choice']} | every block |")
    print(f"| first loss (random init, each side its own) | {rows[0]['full']['loss']:.4f} | {rows[0]['auto']['loss']:.4f} | "
          f"{rows[0]['t_loss']:.4f} |")
    print()
    r0 = rows[0]["full"]
    fb = full["estimate"]["per_rank"]["device_bytes"]
    print(f"Full fine-tune, planned by memfit (fp32 AdamW, no recompute, same shape): {fb:,} B ({gib(fb)}); "
          f"memfit's QLoRA peak RSS (every block recomputed) is {100 * r0['rss'] / fb:.1f}% of it.")
    print(f"Probed peaks (memfit plan --hardware cpu): fp32 products {hw['peak_fp32_flops'] / 1e9:.0f} GFLOP/s, "
          f"bf16 {bf16 / 1e9:.0f} GFLOP/s, streaming {hw['memory_bandwidth'] / 1e9:.1f} GB/s.")
    for mode in ("full", "auto"):
        print(f"memfit phases ({mode}), ms (round 1): " +
              ", ".join(f"{k} {v:.0f}" for k, v in rows[0][mode]["phases"].items()))


if __name__ == "__main__":
    main()
