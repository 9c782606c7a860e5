"""Summarises bench/activation_policies.sh output as a markdown table (medians over rounds)."""
import json
import statistics
import sys
from pathlib import Path


def gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def main() -> None:
    out, rounds = Path(sys.argv[1]), int(sys.argv[2])
    names = sorted(out.glob("c*.name"), key=lambda p: int(p.stem[1:]))
    rows = []
    for i, name in enumerate(names):
        reps = [json.loads((out / f"r{r}_c{i}.json").read_text()) for r in range(1, rounds + 1)]
        ms = statistics.median(r["ms_per_step"] for r in reps)
        rows.append((name.read_text().strip(), reps[0], ms, [r["ms_per_step"] for r in reps]))
    base_ms = rows[0][2]
    j0 = rows[0][1]
    print(f"model {j0['model']['name']}, batch {j0['policy']['batch']} x {j0['policy']['seq']}, "
          f"{rounds} rounds; {(out / 'load.txt').read_text().strip().replace(chr(10), '; ')}\n")
    print("| attention:recompute | planned peak | activations at peak | temporaries at peak | measured high-water "
          "| GFLOP/step | ms/step (median) | time vs first |")
    print("|---|---|---|---|---|---|---|---|")
    for name, j, ms, all_ms in rows:
        m = j["memory"]
        planned, measured = m["planned_peak_bytes"]["device"], m["measured_peak_bytes"]["device"]
        equal = "= planned" if planned == measured else f"{gib(measured)} (DIFFERENT)"
        print(f"| {j['policy']['attention']}:{j['policy']['recompute']} | {gib(planned)} "
              f"| {gib(m['planned_by_category']['activations'])} | {gib(m['planned_by_category']['temporaries'])} "
              f"| {equal} | {j['flops_per_step'] / 1e9:.0f} | {ms:.0f} ({', '.join(f'{x:.0f}' for x in all_ms)}) "
              f"| {ms / base_ms:.3f} |")


if __name__ == "__main__":
    main()
