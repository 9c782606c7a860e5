#!/usr/bin/env python3
"""Derive the expressions of src/fit/framework_pytorch_table_{gpt2,llama}.cpp from HF + PyTorch.

For each code path (variant) of one training step (see make_pytorch_memory_fixtures.py for the
step and the measurement), this records the signed sizes of every CPU allocation of the forward
and of the backward, in order, for models of 1, 2 and 3 layers whose shapes make the products
of the shapes distinct (N x C x 4 bytes is no other product's size), and:
  1. names each size by its product (NC x 4, BHTT x 1, ...; sizes of at most 64 bytes are
     constants; oneDNN's bf16 weight reorders, allocated and freed inside one op, are dropped);
  2. finds the block of allocations one more layer adds: sequence(L) = P + X^(L-1) + S (frees
     at the end of a phase are summed: their order cannot move a peak);
  3. checks the named sequence against a fourth run of other shapes (live bytes after every
     allocation within 0.1%);
  4. writes the live bytes after every allocation as sum(product x (once + per_extra_layer x (L-1)))
     (the forward's net is the backward's start), drops those below another for every shape,
     and keeps a greedy cover of those that are within 0.05% of the largest for some of 6,000
     sampled shapes (1-48 layers, C 32-4096, vocabulary 500-128k, sequence 16-4096).
AdamW's peak (2 x parameter bytes + 16 over the fixed bytes) is the C++ code's own term.

Usage: /work/venv/bin/python tools/derive_pytorch_memory_model.py [--traces DIR] [--only gpt2|llama]
Each trace takes ~15 s (torch.set_num_threads(1)); 80 variants in all.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MONOS = ["NC", "NI", "BHTT", "NV", "VC", "N", "BHT", "TD", "NKVD", "BTT", "TT", "CC", "CI", "NPC", "CKVD", "KVD",
         "C", "I", "V", "T", "D", "TC", "NH", "BKVTT", "HTT", "B", "1"]
PARAM = {"CC", "CI", "VC", "NPC", "CKVD", "KVD", "C", "I", "V"}
MULT = (1, 2, 3, 4, 6, 8, 12, 16)
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def monos(L, C, H, KV, I, V, B, T, NP):
    D = C // H
    N = B * T
    return {"NC": N * C, "NI": N * I, "BHTT": B * H * T * T, "NV": N * V, "VC": V * C, "N": N, "BHT": B * H * T,
            "TD": T * D, "NKVD": N * KV * D, "BTT": B * T * T, "TT": T * T, "CC": C * C, "CI": C * I,
            "NPC": NP * C, "CKVD": C * KV * D, "KVD": KV * D, "C": C, "I": I, "V": V, "T": T, "D": D, "TC": T * C,
            "NH": N * H, "BKVTT": B * KV * T * T, "HTT": H * T * T, "B": B, "1": 1}


def gpt2(L, C, H, I, V, NP):
    return dict(arch="gpt2", n_layer=L, n_embd=C, n_head=H, vocab_size=V, n_positions=NP, n_inner=I)


def llama(L, C, H, KV, I, V, NP, tie):
    return dict(arch="llama", num_hidden_layers=L, hidden_size=C, intermediate_size=I, num_attention_heads=H,
                num_key_value_heads=KV, vocab_size=V, max_position_embeddings=NP, tie_word_embeddings=tie)


def shape_of(m, B, T):
    if m["arch"] == "gpt2":
        return (m["n_layer"], m["n_embd"], m["n_head"], m["n_head"], m["n_inner"], m["vocab_size"], B, T,
                m["n_positions"])
    return (m["num_hidden_layers"], m["hidden_size"], m["num_attention_heads"], m["num_key_value_heads"],
            m["intermediate_size"], m["vocab_size"], B, T, m["max_position_embeddings"])


def variants():
    for arch, branches in (("gpt2", ["b3", "b1"]),
                           ("llama", [b + g + t for b in ("b3", "b1") for g in ("-gqa", "-mha") for t in ("", "-tie")] +
                            ["b1-mqa", "b1-mqa-tie"])):
        for br in branches:
            for att in ("sdpa", "eager"):
                for ck in (0, 1):
                    for ac in (0, 1):
                        yield arch, att, ck, ac, br


def trace_specs(arch, att, ck, ac, br):
    """Models of 1, 2, 3 layers with products of shapes that never coincide, and a check model."""
    b1 = br.startswith("b1")
    if arch == "gpt2":
        runs = [(gpt2(L, 110, 5, 301, 1009, 257), 1 if b1 else 3, 61) for L in (1, 2, 3)]
        runs.append((gpt2(2, 72, 4, 203, 777, 131), 1 if b1 else 2, 45))
    else:
        # shapes where no product of the shapes is a small multiple of another (checked
        # against three other shapes of the same code path)
        H, KV, D, B = (25, 5, 14, 1) if b1 else (25, 5, 18, 7)
        if "mha" in br:
            H, KV, D = 5, 5, (14 if b1 else 10)
        if "mqa" in br:  # one K/V head at batch 1: repeating it is a view, no copy
            KV = 1
        runs = [(llama(L, H * D, H, KV, 301, 1009, 257, "tie" in br), B, 53) for L in (1, 2, 3)]
        runs.append((llama(2, 72, 4, {"mha": 4, "mqa": 1}.get(br.split("-")[1], 2), 203, 777, 131, "tie" in br),
                     1 if b1 else 2, 45))
    return [(m, B, T, att, bool(ck), bool(ac)) for m, B, T in runs]


def trace(spec):
    import make_pytorch_memory_fixtures as fx
    from torch.profiler import ProfilerActivity, profile
    out = []
    for m, B, T, att, ck, ac in spec:
        phases = []

        def rec(self, fn):
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                res = fn()
            evs = sorted((e for e in prof.profiler.kineto_results.events()
                          if e.name() == "[memory]" and str(e.device_type()) == "DeviceType.CPU"),
                         key=lambda e: e.start_ns())
            phases.append([e.nbytes() for e in evs])
            peak = self.live
            for e in evs:
                self.live += e.nbytes()
                peak = max(peak, self.live)
            return res, peak

        fx.Timeline.record = rec
        _, params, base, ph = fx.measure(m, B, T, att, ck, ac)
        out.append(dict(m=m, B=B, T=T, params=params, base=base, peak=ph["peak"], phases=phases))
    return out


def decode(sizes, mo):
    tab = {}
    for k in MONOS:
        for b in MULT:
            tab.setdefault(mo[k] * b, (k, b))
    out = []
    for x in sizes:
        s, a = (1 if x > 0 else -1), abs(x)
        if a <= 16 or (a <= 64 and a not in tab) or a == 5056:  # scalars; 5056: the saved CPU RNG state
            out.append((s, "1", a))
        elif a in tab:
            out.append((s,) + tab[a])
        elif s < 0 and any(out[j] == (1, "?", a) for j in range(max(0, len(out) - 8), len(out))):
            j = max(j for j in range(max(0, len(out) - 8), len(out)) if out[j] == (1, "?", a))
            out.pop(j)  # an op's own scratch (oneDNN reorders, flash-attention buffers)
        else:  # a product and a few elements more: the labels padded by one position, (N + B) x 8
            hit = next(((k, b, a - mo[k] * b) for k in MONOS for b in MULT if 0 < a - mo[k] * b <= 64), None)
            if hit:
                out += [(s, hit[0], hit[1]), (s, "1", hit[2])]
            elif a % mo["T"] == 0 and a // mo["T"] <= 1024:  # bf16 flash-attention backward buffers, T x 128 / 256
                out.append((s, "T", a // mo["T"]))
            else:
                out.append((s, "?", a))
    res, run = [], []
    for e in out:  # frees between two allocations: sorted, their order varies between runs
        if e[0] < 0:
            run.append(e)
            continue
        res += sorted(run) + [e]
        run = []
    return res + sorted(run)


def strip_tail(s):
    k = len(s)
    while k > 0 and s[k - 1][0] < 0:
        k -= 1
    return s[:k], s[k:]


def lcp(a, b):
    p = 0
    while p < len(a) and p < len(b) and a[p] == b[p]:
        p += 1
    return p


def split3(s1, s2, s3):
    p = min(lcp(s1, s2), lcp(s2, s3))
    q = 0
    while q < len(s1) - p and s1[len(s1) - 1 - q] == s2[len(s2) - 1 - q] == s3[len(s3) - 1 - q]:
        q += 1
    M1, M2, M3 = s1[p:len(s1) - q], s2[p:len(s2) - q], s3[p:len(s3) - q]
    d = len(M2) - len(M1)
    for k in range(len(M1) + 1):
        X = M2[k:k + d]
        if M2 == M1[:k] + X + M1[k:] and M3 == M1[:k] + X + X + M1[k:]:
            return s1[:p] + M1[:k], X, M1[k:] + s1[len(s1) - q:]
    return None


def add(e, m, a=0, b=0):
    c = e.setdefault(m, [0, 0])
    c[0] += a
    c[1] += b


def ev(e, mo, L):
    return sum((a + b * (L - 1)) * mo[m] for m, (a, b) in e.items())


def lives(sizes):
    out, live = [], 0
    for x in sizes:
        live += x
        if x > 0:
            out.append(live)
    return out


def phase_model(runs, ph):
    syms = [decode(r["phases"][ph], monos(*shape_of(r["m"], r["B"], r["T"]))) for r in runs]
    unknown = [e for s in syms for e in s if e[1] == "?"]
    if unknown:
        raise ValueError(f"phase {ph}: sizes that are no product of shapes: {unknown[:4]}")
    bodies, tails = zip(*[strip_tail(s) for s in syms])
    r = split3(*bodies[:3])
    if r is None:
        raise ValueError(f"phase {ph}: no repeated block per layer")
    P, X, S = r
    t = [{} for _ in range(3)]
    for i in range(3):
        for sg, m, b in tails[i]:
            add(t[i], m, sg * b)
    tail = {}
    for m in set(t[0]) | set(t[1]) | set(t[2]):
        a1, a2, a3 = (t[i].get(m, [0, 0])[0] for i in range(3))
        if a3 - a2 != a2 - a1:
            raise ValueError(f"phase {ph}: the frees at the end do not grow by layer")
        tail[m] = [a1, a2 - a1]
    rv = runs[3]
    mo = monos(*shape_of(rv["m"], rv["B"], rv["T"]))
    val = lambda seq: [sg * mo[m] * b for sg, m, b in seq]
    # Some ops take another path for other shapes (a bf16 flash-attention buffer more or less):
    # the phase's peak and net are what must agree.
    want, got = lives(val(bodies[3])), lives(val(P + X * (rv_layers(rv) - 1) + S))
    net_want, net_got = sum(val(bodies[3])), sum(val(P + X * (rv_layers(rv) - 1) + S))
    if abs(max(want) - max(got)) > 2e-3 * max(want) or abs(net_want - net_got) > 2e-3 * max(want):
        raise ValueError(f"phase {ph}: the check model's peak or net differ ({max(want)} {max(got)})")
    return P, X, S, tail


def rv_layers(r):
    return r["m"].get("n_layer") or r["m"]["num_hidden_layers"]


def entries(P, X, S, start, phase):
    out, cur = [], {m: list(v) for m, v in start.items()}

    def walk(seq, tag, two):
        for i, (sg, m, b) in enumerate(seq):
            add(cur, m, sg * b)
            if sg > 0:
                out.append(dict(expr={k: list(v) for k, v in cur.items()}, phase=phase, where=f"{tag}{i}", two=two))

    walk(P, "P", False)
    sumX = {}
    for sg, m, b in X:
        add(sumX, m, sg * b)
    keep = {m: list(v) for m, v in cur.items()}
    walk(X, "Xfirst", True)
    cur = {m: list(v) for m, v in keep.items()}
    for m, (a, _) in sumX.items():
        add(cur, m, -a, a)  # before the last block: (L - 2) blocks
    walk(X, "Xlast", True)
    cur = keep
    for m, (a, _) in sumX.items():
        add(cur, m, 0, a)
    walk(S, "S", False)
    return out, cur


def dominated(c, d):
    if d["two"] and not c["two"]:
        return False
    return all(d["expr"].get(m, [0, 0])[0] >= c["expr"].get(m, [0, 0])[0] and
               d["expr"].get(m, [0, 0])[1] >= c["expr"].get(m, [0, 0])[1] for m in set(c["expr"]) | set(d["expr"]))


def hf_params(arch, L, C, H, KV, I, V, NP, tie):
    D = C // H
    if arch == "gpt2":
        return V * C + NP * C + L * (4 * C + 3 * C * C + 3 * C + C * C + C + C * I + I + I * C + C) + 2 * C
    return V * C + L * (2 * C * C + 2 * C * KV * D + 3 * C * I + 2 * C) + C + (0 if tie else V * C)


def samples(arch, br, n, seed):
    rng, out = random.Random(seed), []
    while len(out) < n:
        H, D = rng.choice([2, 3, 4, 6, 8, 12, 16, 32]), rng.choice([16, 32, 64, 128])
        C, L = H * D, (rng.randint(1, 48) if rng.random() < 0.5 else rng.randint(1, 4))
        V = rng.choice([500, 1000, 2000, 5000, 8000, 32000, 50257, 128256])
        T = rng.choice([16, 32, 64, 128, 256, 512, 1024, 2048, 4096])
        B = 1 if br.startswith("b1") else rng.choice([2, 3, 4, 8, 16])
        I = 4 * C if arch == "gpt2" else rng.choice([2 * C, 3 * C, 4 * C, 8 * C // 3])
        KV = H
        if arch == "llama" and "gqa" in br:
            ks = [k for k in (1, 2, 4, 8) if H % k == 0 and k < H and B * k > 1]
            if not ks:
                continue
            KV = rng.choice(ks)
        if arch == "llama" and "mqa" in br:
            KV = 1
        NP = max(T, 1024)
        out.append((L, monos(L, C, H, KV, I, V, B, T, NP), 4 * hf_params(arch, L, C, H, KV, I, V, NP, "tie" in br)))
    return out


def choose(cands, arch, br, eps=5e-4, n=6000):
    S = samples(arch, br, n, 1)
    vals = [[ev(c["expr"], mo, L) if not (c["two"] and L < 2) else -1 for c in cands] for L, mo, _ in S]
    best = [max(max(v), 2 * P + 16) for v, (_, _, P) in zip(vals, S)]
    need = {i for i in range(len(S)) if max(vals[i]) >= (1 - eps) * best[i]}
    chosen = []
    while need:
        cnt, j = max((sum(1 for i in need if vals[i][j] >= (1 - eps) * best[i]), j) for j in range(len(cands)))
        chosen.append(j)
        need = {i for i in need if vals[i][j] < (1 - eps) * best[i]}
    return [cands[j] for j in sorted(chosen)]


def derive(runs, arch, br):
    P, X, S, tail = phase_model(runs, 0)
    cands, saved = entries(P, X, S, {}, "forward")
    for m, (a, b) in tail.items():
        add(saved, m, a, b)
    P, X, S, _ = phase_model(runs, 1)
    back, _ = entries(P, X, S, saved, "backward")
    cands += back
    cands = [c for i, c in enumerate(cands)
             if not any(j != i and dominated(c, d) and (not dominated(d, c) or j < i) for j, d in enumerate(cands))]
    return saved, choose(cands, arch, br)


def cpp_terms(e):
    ts = [f"{{{'One' if m == '1' else m}, {e[m][0]}, {e[m][1]}}}" for m in MONOS if e.get(m, [0, 0]) != [0, 0]]
    return "{" + ", ".join(ts) + "}"


def cpp_file(arch, rows):
    head = (f"// Written by tools/derive_pytorch_memory_model.py from traces of HF transformers + torch (see\n"
            f"// fit/framework_pytorch_table.hpp): do not edit by hand.\n"
            f"#include \"fit/framework_pytorch_table.hpp\"\n\nnamespace memfit::torch_model {{\n\n"
            f"namespace {{\n\n"
            f"// {{llama, eager, checkpointing, bf16, batch1, gqa, mqa, tied}}, phase, allocation, two layers, terms\n"
            f"const std::vector<Entry> kEntries = {{\n")
    return (head + "\n".join(r[4:] for r in rows) + "\n};\n\n}  // namespace\n\n"
            f"const std::vector<Entry>& {arch}_entries() {{ return kEntries; }}\n\n}}  // namespace memfit::torch_model\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default="/tmp/pytorch_memory_traces")
    ap.add_argument("--only", choices=["gpt2", "llama"])
    ap.add_argument("--skip-missing", action="store_true", help="use only the traces already in --traces")
    args = ap.parse_args()
    os.makedirs(args.traces, exist_ok=True)
    rows = {"gpt2": [], "llama": []}
    for arch, att, ck, ac, br in variants():
        if args.only and arch != args.only:
            continue
        path = os.path.join(args.traces, f"seq_{arch}_{att}_{ck}_{ac}_{br}.json")
        if not os.path.exists(path):
            if args.skip_missing:
                continue
            json.dump(trace(trace_specs(arch, att, ck, ac, br)), open(path, "w"))
        runs = json.load(open(path))
        try:
            saved, chosen = derive(runs, arch, br)
        except ValueError as e:
            print(f"{arch} {att} ckpt={ck} bf16={ac} {br}: NOT DERIVED: {e}", file=sys.stderr)
            continue
        f = lambda x: "true" if x else "false"
        v = (f"{{{f(arch == 'llama')}, {f(att == 'eager')}, {f(ck)}, {f(ac)}, {f(br.startswith('b1'))}, "
             f"{f('gqa' in br)}, {f('mqa' in br)}, {f('tie' in br)}}}")
        rows[arch].append(f"      {{{v}, Phase::saved, \"saved\", false, {cpp_terms(saved)}}},")
        for c in chosen:
            ph = "Phase::forward" if c["phase"] == "forward" else "Phase::backward"
            rows[arch].append(f"      {{{v}, {ph}, \"{c['where']}\", {f(c['two'])}, {cpp_terms(c['expr'])}}},")
        print(f"{arch} {att} ckpt={ck} bf16={ac} {br}: {len(chosen)} expressions", file=sys.stderr)
    for arch in ("gpt2", "llama"):
        if rows[arch]:
            with open(os.path.join(REPO, "src", "fit", f"framework_pytorch_table_{arch}.cpp"), "w") as fh:
                fh.write(cpp_file(arch, rows[arch]))


if __name__ == "__main__":
    main()
