"""Summarises bench/optimizer_convergence.sh output as a markdown table (timings: medians over rounds)."""
import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    out, rounds = Path(sys.argv[1]), int(sys.argv[2])
    opts = ("adamw", "adamw8bit")
    runs = {opt: json.loads((out / f"{opt}.json").read_text()) for opt in opts}
    timing = {opt: [json.loads((out / f"{opt}.timing{r}.json").read_text()) for r in range(1, rounds + 1)]
              for opt in opts}
    a, q = runs["adamw"], runs["adamw8bit"]
    val = {opt: runs[opt]["validation"]["last"] for opt in opts}
    ms = {opt: statistics.median(r["ms_per_step"] for r in timing[opt]) for opt in opts}
    ratios = [q8["ms_per_step"] / aw["ms_per_step"] for aw, q8 in zip(timing["adamw"], timing["adamw8bit"])]
    state = {opt: runs[opt]["memory"]["optimizer_state_bytes"] for opt in opts}
    per_param = {opt: runs[opt]["memory"]["optimizer_state_bytes_per_parameter"] for opt in opts}
    peak = {opt: runs[opt]["memory"]["planned_peak_bytes"]["device"] for opt in opts}
    equal = all(r["memory"]["planned_peak_bytes"] == r["memory"]["measured_peak_bytes"]
                for opt in opts for r in [runs[opt]] + timing[opt])
    m = a["model"]
    print(f"model {m['name']} ({m['parameters']} parameters), batch {a['policy']['batch']} x {a['policy']['seq']}, "
          f"{a['steps']} steps, data {a['data']['source']}")
    print()
    print("| | AdamW | 8-bit AdamW |")
    print("|---|---|---|")
    for step_loss in zip(a["validation"]["history"], q["validation"]["history"]):
        print(f"| validation loss at step {step_loss[0]['step']} | {step_loss[0]['loss']:.4f} | {step_loss[1]['loss']:.4f} |")
    print(f"| final training loss (one batch) | {a['loss']['last']:.4f} | {q['loss']['last']:.4f} |")
    print(f"| validation loss difference | | {100 * (val['adamw8bit'] - val['adamw']) / val['adamw']:+.2f}% |")
    print(f"| optimizer state | {state['adamw']} B ({per_param['adamw']:.4f} B/param) | "
          f"{state['adamw8bit']} B ({per_param['adamw8bit']:.4f} B/param) |")
    print(f"| planned device peak | {peak['adamw'] / 2**20:.2f} MiB | {peak['adamw8bit'] / 2**20:.2f} MiB |")
    steps = timing["adamw"][0]["steps"]
    print(f"| ms/step (median of {rounds} runs of {steps} steps) | {ms['adamw']:.1f} | {ms['adamw8bit']:.1f} |")
    print(f"| step-time ratio (median of per-round ratios) | 1.00 | {statistics.median(ratios):.3f} "
          f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)}) |")
    print(f"| measured == planned (every run) | {equal} | {equal} |")


if __name__ == "__main__":
    main()
