"""Summarises bench/gpt2_step_vs_pytorch.sh output as a markdown table (median over rounds).

  summarize_step_bench.py OUT_DIR ROUNDS PRECISION

PRECISION fp32: columns memfit fp32 and PyTorch fp32. PRECISION bf16: memfit bf16, memfit
fp32 and PyTorch bf16 (autocast), with the speed-up of memfit bf16 over both."""
import json
import statistics
import sys
from pathlib import Path


def load(out, name, rounds):
    runs = []
    for r in range(1, rounds + 1):
        text = (out / f"{name}-{r}.json").read_text().strip()
        try:
            runs.append(json.loads(text))  # memfit's report: one JSON document
        except json.JSONDecodeError:
            runs.append(json.loads(text.splitlines()[-1]))  # the PyTorch script: its last line
    return runs


def main() -> None:
    out, rounds, precision = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    sides = [("memfit", p) for p in (["bf16", "fp32"] if precision == "bf16" else ["fp32"])]
    sides.append(("torch", precision))
    runs = {s: load(out, f"{s[0]}-{s[1]}", rounds) for s in sides}

    def ms(side):
        key = "ms_per_step" if side[0] == "memfit" else "ms_per_step_median"
        return statistics.median(run[key] for run in runs[side])

    def rss(side):
        key = "max_rss_bytes" if side[0] == "memfit" else "peak_rss_bytes"
        return max((run["memory"][key] if side[0] == "memfit" else run[key]) for run in runs[side])

    m0 = runs[sides[0]][0]
    tokens = m0["tokens_per_step"]
    n = m0["model"]["parameters"]
    L, C, T = m0["model"]["n_layer"], m0["model"]["n_embd"], m0["policy"]["seq"]
    model_flops = tokens * (6 * n + 6 * L * T * C)  # 6N per token plus causal attention
    names = {("memfit", "fp32"): "memfit fp32", ("memfit", "bf16"): "memfit bf16",
             ("torch", "fp32"): "PyTorch eager fp32", ("torch", "bf16"): "PyTorch bf16 autocast"}
    print("| | " + " | ".join(names[s] for s in sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    print(f"| ms/step (median of {rounds} rounds) | " + " | ".join(f"{ms(s):.0f}" for s in sides) + " |")
    print("| tokens/s | " + " | ".join(f"{tokens / ms(s) * 1e3:.0f}" for s in sides) + " |")
    print("| model GFLOP/s (6N + attention) | " + " | ".join(f"{model_flops / ms(s) / 1e6:.0f}" for s in sides) + " |")
    cells = []
    for s in sides:
        if s[0] != "memfit":
            cells.append("")
            continue
        r = runs[s][0]["memory"]
        equal = all(run["memory"]["planned_peak_bytes"] == run["memory"]["measured_peak_bytes"] for run in runs[s])
        cells.append(f"{r['planned_peak_bytes']['device'] / 2**30:.3f} GiB ({'= measured' if equal else 'MEASURED DIFFERS'})")
    print("| planned device peak | " + " | ".join(cells) + " |")
    print("| peak RSS | " + " | ".join(f"{rss(s) / 2**30:.2f} GiB" for s in sides) + " |")
    base = sides[0]
    print(f"| {names[base]} speed-up (tokens/s) | " + " | ".join(f"{ms(s) / ms(base):.2f}x" for s in sides) + " |")
    print(f"| peak RSS / {names[base]}'s | " + " | ".join(f"{rss(s) / rss(base):.2f}" for s in sides) + " |")
    t0 = runs[sides[-1]][0]
    print(f"\nPyTorch {t0.get('torch')}, attention {t0.get('attn_implementation')}, threads {t0.get('threads')}; "
          f"per-round ms/step: " + "; ".join(
              f"{names[s]} " + ", ".join(f"{(r['ms_per_step'] if s[0] == 'memfit' else r['ms_per_step_median']):.0f}"
                                         for r in runs[s]) for s in sides))


if __name__ == "__main__":
    main()
