"""Summarises bench/optimizer_convergence.sh output as a markdown table (medians over rounds)."""
import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    out, rounds = Path(sys.argv[1]), int(sys.argv[2])
    runs = {opt: [json.loads((out / f"{opt}{r}.json").read_text()) for r in range(1, rounds + 1)]
            for opt in ("adamw", "adamw8bit")}
    a, q = runs["adamw"][0], runs["adamw8bit"][0]
    # Same seed, data and schedule: every round gives the same losses (deterministic kernels).
    val = {opt: runs[opt][0]["validation"]["last"] for opt in runs}
    ms = {opt: statistics.median(r["ms_per_step"] for r in runs[opt]) for opt in runs}
    state = {opt: runs[opt][0]["memory"]["optimizer_state_bytes"] for opt in runs}
    per_param = {opt: runs[opt][0]["memory"]["optimizer_state_bytes_per_parameter"] for opt in runs}
    peak = {opt: runs[opt][0]["memory"]["planned_peak_bytes"]["device"] for opt in runs}
    equal = all(r["memory"]["planned_peak_bytes"] == r["memory"]["measured_peak_bytes"]
                for opt in runs for r in runs[opt])
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
    print(f"| ms/step (median of {rounds} rounds) | {ms['adamw']:.1f} | {ms['adamw8bit']:.1f} |")
    print(f"| step-time ratio | 1.00 | {ms['adamw8bit'] / ms['adamw']:.3f} |")
    print(f"| measured == planned (every run) | {equal} | {equal} |")


if __name__ == "__main__":
    main()
