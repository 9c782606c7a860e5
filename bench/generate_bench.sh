#!/usr/bin/env bash
# Generation speed: memfit generate against transformers' generate on the same model, prompt
# and token count, greedy, fp32, the same threads. The model is GPT-2 124M made from HF's
# default GPT2Config with seeded random weights (written once as safetensors + config.json,
# read by both), so no download is needed; --ignore-eos / min_new_tokens make both generate
# exactly --new tokens. Rounds alternate the two programs so both see the same machine load;
# the summary gives medians of prefill and decode tokens/s, memfit's probed-peak shares and
# both peak RSS.
#
#   bench/generate_bench.sh [--prompt 64] [--new 128] [--rounds 3] [--threads 2] [--python /work/venv/bin/python]
# Needs a built memfit (scripts/build) and a python with torch, transformers and safetensors.
set -euo pipefail
cd "$(dirname "$0")/.."
prompt=64 new=128 rounds=3 threads=2 python=/work/venv/bin/python
while [ $# -gt 0 ]; do
  case "$1" in
    --prompt) prompt=$2; shift 2 ;;
    --new) new=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
out=$(mktemp -d)
export OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=passive
"$python" - "$out" "$prompt" <<'PY'
import json, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
out, prompt = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config()).eval()
model.save_pretrained(f"{out}/model", safe_serialization=True)
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, model.config.vocab_size, (prompt,), generator=g).tolist()
json.dump(ids, open(f"{out}/prompt.json", "w"))
PY
ids=$("$python" -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1])))))" "$out/prompt.json")
cat > "$out/hf.py" <<'PY'
import json, resource, sys, time, torch
from transformers import GPT2LMHeadModel
out, new, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
model = GPT2LMHeadModel.from_pretrained(f"{out}/model", dtype=torch.float32).eval()
ids = torch.tensor([json.load(open(f"{out}/prompt.json"))])
kw = dict(do_sample=False, use_cache=True, pad_token_id=0)
with torch.no_grad():
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
    t = time.perf_counter(); model(ids); prefill = time.perf_counter() - t
    t = time.perf_counter(); seq = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
    total = time.perf_counter() - t
decode = max(total - prefill, 1e-9)
print(json.dumps({"prefill_tokens_per_second": ids.shape[1] / prefill,
                  "decode_tokens_per_second": (new - 1) / decode,
                  "tokens": seq[0, ids.shape[1]:].tolist(),
                  "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
PY
for r in $(seq 1 "$rounds"); do
  build/memfit generate --model "$out/model" --load "$out/model" --prompt-ids "$ids" --max-new-tokens "$new" \
    --ignore-eos --threads "$threads" --report-json "$out/memfit_$r.json" > "$out/memfit_$r.log"
  "$python" "$out/hf.py" "$out" "$new" "$threads" > "$out/hf_$r.json"
done
"$python" - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
m = [json.load(open(f"{out}/memfit_{r}.json")) for r in range(1, rounds + 1)]
h = [json.load(open(f"{out}/hf_{r}.json")) for r in range(1, rounds + 1)]
med = lambda xs: statistics.median(xs)
print(f"model GPT-2 124M (random weights), prompt {m[0]['prompt_tokens']} tokens, {m[0]['new_tokens']} new, greedy fp32")
print(f"same tokens as transformers: {all(a['tokens'] == b['tokens'] for a, b in zip(m, h))}")
for name, key in (("prefill", "prefill_tokens_per_second"), ("decode", "decode_tokens_per_second")):
    a, b = med([x[key] for x in m]), med([x[key] for x in h])
    print(f"{name:8s} memfit {a:9.1f} tok/s   transformers {b:9.1f} tok/s   ratio {a / b:.2f}x")
print(f"memfit prefill share of probed GEMM peak {100 * med([x['speed']['prefill_flops_share'] for x in m]):.1f}%, "
      f"decode share of probed stream bandwidth {100 * med([x['speed']['decode_bandwidth_share'] for x in m]):.1f}%")
print(f"peak RSS memfit {med([x['memory']['max_rss_bytes'] for x in m]) / 2**20:.0f} MiB, "
      f"transformers {med([x['max_rss_bytes'] for x in h]) / 2**20:.0f} MiB; "
      f"memfit planned == measured: {all(x['memory']['planned_equals_measured'] for x in m)}")
PY
echo "raw results in $out"
