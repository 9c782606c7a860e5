"""Summarises bench/gpt2_step_vs_pytorch.sh output as a markdown table (median over rounds)."""
import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    out, rounds = Path(sys.argv[1]), int(sys.argv[2])
    mem = [json.loads((out / f"memfit{r}.json").read_text()) for r in range(1, rounds + 1)]
    tor = [json.loads((out / f"torch{r}.json").read_text().strip().splitlines()[-1]) for r in range(1, rounds + 1)]
    m_ms = statistics.median(m["ms_per_step"] for m in mem)
    t_ms = statistics.median(t["ms_per_step_median"] for t in tor)
    m0, t0 = mem[0], tor[0]
    tokens = m0["tokens_per_step"]
    n = m0["model"]["parameters"]
    # Model FLOPs per step: 6 N per token plus attention (6 L T C per token, causal).
    L, C, T = m0["model"]["n_layer"], m0["model"]["n_embd"], m0["policy"]["seq"]
    model_flops = tokens * (6 * n + 6 * L * T * C)
    print("| | memfit fp32 | PyTorch eager fp32 |")
    print("|---|---|---|")
    print(f"| ms/step (median of {rounds} rounds) | {m_ms:.0f} | {t_ms:.0f} |")
    print(f"| tokens/s | {tokens / m_ms * 1e3:.0f} | {tokens / t_ms * 1e3:.0f} |")
    print(f"| model GFLOP/s (6N + attention) | {model_flops / m_ms / 1e6:.0f} | {model_flops / t_ms / 1e6:.0f} |")
    print(f"| executed GFLOP/s (memfit's program) | {m0['flops_per_step'] / m_ms / 1e6:.0f} | |")
    print(f"| planned device peak | {m0['memory']['planned_peak_bytes']['device'] / 2**30:.3f} GiB | |")
    print(f"| measured arena high-water | {m0['memory']['measured_peak_bytes']['device'] / 2**30:.3f} GiB | |")
    print(f"| peak RSS | {max(m['memory']['max_rss_bytes'] for m in mem) / 2**30:.2f} GiB | "
          f"{max(t['peak_rss_bytes'] for t in tor) / 2**30:.2f} GiB |")
    print(f"| speed-up (tokens/s) | {t_ms / m_ms:.2f}x | 1.00x |")
    print(f"\nPyTorch {t0.get('torch')}, attention {t0.get('attn_implementation')}, "
          f"threads {t0.get('threads')}; memfit planned == measured: "
          f"{all(m['memory']['planned_peak_bytes'] == m['memory']['measured_peak_bytes'] for m in mem)}")


if __name__ == "__main__":
    main()
