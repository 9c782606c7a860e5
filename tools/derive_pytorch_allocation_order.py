#!/usr/bin/env python3
"""Derive src/fit/framework_pytorch_order_{gpt2,llama}.cpp: the CUDA allocation sequence of the
forward and backward of one HF training step, for any shapes and number of layers.

For each variant of fit/framework_pytorch_table.hpp this records, on the CPU under torch's
profiler with the CUDA rules of cuda_allocation_rules.py applied, one training step of models of
1 to 5 layers whose products of shapes are distinct (the shapes of
derive_pytorch_memory_model.py), and:
  1. keeps the allocations CUDA makes (rule R4 drops the others) and names each size by its
     product of shapes (N x C x 4 bytes, ...) or by its formula (the attention kernels'
     log-sum-exp and workspaces); flags the allocations the C++ side adds to: a product's output
     (the cuBLAS workspaces, R5), a sum over rows (the reduction's staging buffer, R6), softmax's
     backward (R7), embedding backward (its sort, R8: none at these sizes);
  2. splits the forward's and the backward's allocations into P + X^(L-1) + S (X: what one more
     layer adds), from the 1-, 2- and 3-layer runs;
  3. gives each allocation its death: the allocation after which it is freed (frees between two
     allocations commute in the allocator), as a place in a phase laid out as P X X ... S: copy
     c + k, (L - 2) - c + k, k or (L - 2) + k of X from the allocation's own copy c, fitted on
     the runs of 1-4 layers; where that copy is outside the layers the relation holds for, the
     same formula's place in P or S, or a fixed place, or E (freed after the optimizer's
     allocations: gradients, the loss); a model of one layer may have its own;
  4. checks the result: the 5-layer run to the allocation and death, and a run of other shapes
     (2 layers) to the byte;
  5. writes each architecture's distinct allocations once, and each variant's phases as codes.
The C++ side (fit/pytorch_allocation_order.cpp) adds the model load, the optimizer's allocations
and the rules' allocations, and replays the steps through fit/caching_allocator's model.

The CUDA traces the rules were found on ran transformers 5.17; this runs the transformers the
venv has (5.24, the version of the CPU tables and fixtures). Their Llama differs in a few
allocations (the K/V cache's dtype under autocast, the rotary angles by a product or a multiply):
tests/fit/pytorch_allocation_order_test.cpp prints how many.
Usage: /work/venv/bin/python tools/derive_pytorch_allocation_order.py [--cache DIR] [--only gpt2|llama]
(about 10 minutes on one core: 80 variants of 6 tiny models each)
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import derive_pytorch_memory_model as dm  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FLAG_BITS = {"gemm": 1, "addmm": 2, "sum_rows4": 4, "sum_rows2": 8, "softmax_bwd": 16, "embedding": 32,
             "embedding_positions": 64}
PHASES = ("forward", "backward")


def flag_bits(f, size, tokens):
    b = 0
    for k in ("gemm", "addmm", "softmax_bwd"):
        if f.get(k):
            b |= FLAG_BITS[k]
    if "sum_rows" in f:
        b |= FLAG_BITS["sum_rows4" if size == 4 * f["sum_rows"][1] else "sum_rows2"]
    if "embedding" in f:  # over the tokens (B x T indices) or the positions (T)
        b |= FLAG_BITS["embedding" if f["embedding"][0] == tokens else "embedding_positions"]
    return b


def run_items(m, B, T, att, ck, ac):
    """One step's forward and backward allocations: [{bytes, flags, kind, death}], death = (phase, index) or 'E'."""
    import torch
    import transformers
    import cuda_allocation_rules as rules
    import make_pytorch_memory_fixtures as fx
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(fx.hf_config(m), attn_implementation=att).train()
    events = rules.record(model, B, T, ck, ac, steps=1, load=False)
    flags = rules.classify(events)
    items = {p: [] for p in PHASES}
    where, last, k = {}, None, 0
    for ev in events:
        if ev[0] > 0:
            f = flags[k]
            ph = rules.phase_of(ev[1])[:-1]
            if f is not None:
                if ph in PHASES:
                    where[k] = (ph, len(items[ph]))
                    items[ph].append(dict(bytes=ev[0], flags=flag_bits(f, ev[0], B * T), kind=f["kind"], death=None))
                    last = where[k]
                else:
                    last = None
            k += 1
        elif -ev[0] in where:
            ph, i = where.pop(-ev[0])
            items[ph][i]["death"] = last if last is not None else "E"
    for ph in PHASES:
        for it in items[ph]:
            if it["death"] is None:
                it["death"] = "E"  # alive at the end of the recording: freed later, with the step's others
    return items


def decode(a, mo):
    """A size as a sum of products of shapes: [(mono, bytes per unit)], sorted."""
    tab = {}
    for k in dm.MONOS:
        for b in dm.MULT:
            tab.setdefault(mo[k] * b, (k, b))
    if a in tab:
        return (tab[a],)
    for k in dm.MONOS:
        for b in dm.MULT:
            r = a - mo[k] * b
            if 0 < r and r in tab and tab[r][0] in ("B", "1", "T", "N"):
                return tuple(sorted([(k, b), tab[r]]))
            if 0 < r <= 64:
                return tuple(sorted([(k, b), ("1", r)]))
    if a <= 64:
        return (("1", a),)
    raise ValueError(f"size {a} is no product of shapes")


def symbolize(items, mo):
    for ph in PHASES:
        for it in items[ph]:
            it["expr"] = (("1", it["bytes"]),) if it["kind"] == "const" else ("K", it["kind"]) if it["kind"] else \
                decode(it["bytes"], mo)
            it["token"] = (it["expr"], it["flags"])


def split(runs, ph):
    """P, X, S lengths of a phase from the runs of 1, 2, 3 layers."""
    toks = [[it["token"] for it in r[ph]] for r in runs[:3]]
    s = dm.split3(*toks)
    if s is None:
        raise ValueError(f"{ph}: no repeated block per layer")
    P, X, S = s
    return len(P), len(X), len(S)


FAMILIES = ("s", "o", "a", "e")  # copy c + k, (L - 2) - c + k, k, (L - 2) + k
MARGINS = ((0, 0), (0, 1), (1, 0), (1, 1))  # copies the relation holds for: [lo, L - 2 - hi]


def copy_of(fam, k, c, L):
    return {"s": c + k, "o": (L - 2) - c + k, "a": k, "e": (L - 2) + k}[fam]


def region_of(ph, i, L, shape):
    a, b, s = shape[ph]
    if i < a:
        return "P", i
    if i < a + b * (L - 1):
        return "X", None
    return "S", i - a - b * (L - 1)


def fit_death(occ, shape):
    """occ: [(L, c, target)], target 'E' or (phase, index). A target is addressed as a place in a
    phase laid out as P X X ... S: index len(P) + len(X) x copy + pos, copy a function of the
    allocation's copy c (0 outside X) and L. Where that copy is not in the model (below 0, past
    L - 2), the death falls either to the same formula's index (inside P or S: 'V'), or to a fixed
    place of P or S of either phase, or E. Returns 'E' or (phase, family, k, pos, low, high)."""
    if all(t == "E" for _, _, t in occ):
        return "E"
    total = lambda ph, L: shape[ph][0] + shape[ph][1] * (L - 1) + shape[ph][2]
    inx = [(L, t) for L, _, t in occ if t != "E" and region_of(t[0], t[1], L, shape)[0] == "X"]
    L0, t0 = inx[0] if inx else next((L, t) for L, _, t in occ if t != "E")
    ph = t0[0]
    a, b, _ = shape[ph]
    pos = (t0[1] - a) % b
    best = None
    for margin, fam, k in ((m, f, k) for m in MARGINS for f in FAMILIES
                           for k in range(-(a // b) - 2, shape[ph][2] // b + 3)):
        if True:
            sides, ok = {"<": [], ">": []}, True
            for L, c, t in occ:
                cc = copy_of(fam, k, c, L)
                if margin[0] <= cc <= L - 2 - margin[1]:
                    ok = t == (ph, a + b * cc + pos)
                else:
                    sides["<" if cc < margin[0] else ">"].append((L, a + b * cc + pos, t))
                if not ok:
                    break
            if not ok:
                continue
            spec = {}
            for side, hits in sides.items():
                if all(t != "E" and t == (ph, v) and 0 <= v < total(ph, L) for L, v, t in hits):
                    spec[side] = "V"
                    continue
                fixed = {"E" if t == "E" else (t[0],) + region_of(t[0], t[1], L, shape) for L, _, t in hits}
                if len(fixed) != 1 or any(f != "E" and f[1] == "X" for f in fixed):
                    ok = False
                    break
                spec[side] = next(iter(fixed))
            if ok:
                # the relation that explains the most deaths itself
                fixed = sum(len(h) for side, h in sides.items() if spec[side] != "V")
                score = (fixed, sum(len(h) for h in sides.values()), sum(margin), abs(k))
                if best is None or score < best[0]:
                    best = (score, (ph, fam, k, pos, spec["<"], spec[">"], margin))
    if best is None:
        raise ValueError(f"no relation explains the deaths {occ[:6]}")
    return best[1]


def derive_variant(runs):
    """runs: items of the models of 1-5 layers and the check model (2 layers, other shapes)."""
    shape = {ph: split(runs, ph) for ph in PHASES}
    for L, r in zip((1, 2, 3, 4, 5), runs[:5]):
        for ph in PHASES:
            a, b, s = shape[ph]
            if len(r[ph]) != a + b * (L - 1) + s:
                raise ValueError(f"{ph}: {len(r[ph])} allocations at {L} layers, not {a} + {b} x {L - 1} + {s}")
    canon = {ph: [] for ph in PHASES}
    for ph in PHASES:
        a, b, s = shape[ph]
        for region, n in (("P", a), ("X", b), ("S", s)):
            for pos in range(n):
                occ, proto = [], None
                for L, r in zip((1, 2, 3, 4), runs[:4]):
                    copies = range(L - 1) if region == "X" else [0]
                    for c in copies:
                        i = pos if region == "P" else a + b * c + pos if region == "X" else a + b * (L - 1) + pos
                        it = r[ph][i]
                        proto = proto or it
                        occ.append((L, c, it["death"]))
                # A model of one layer may free an allocation of P or S elsewhere than deeper ones do
                # (the layer is both the first and the last): then its own place, as an index.
                try:
                    death, one = fit_death(occ, shape), None
                except ValueError:
                    death = fit_death([o for o in occ if o[0] > 1], shape)
                    one = next(t for L, _, t in occ if L == 1)
                canon[ph].append(dict(region=region, expr=proto["expr"], flags=proto["flags"], death=death,
                                      one_layer=one))
    for L, r in zip((1, 2, 3, 4, 5), runs[:5]):
        check_generated(canon, shape, r, L)
    return canon, shape


def generate(canon, shape, L):
    """The items (expr, flags, death as (phase, index) or 'E') of a model of L layers."""
    out = {}
    for ph in PHASES:
        a, b, s = shape[ph]
        seq = []
        for region, copies in (("P", [0]), ("X", range(L - 1)), ("S", [0])):
            for c in copies:
                for it in (x for x in canon[ph] if x["region"] == region):
                    seq.append((it, c))
        out[ph] = [(it["expr"], it["flags"], it["one_layer"] if L == 1 and it["one_layer"] is not None
                    else resolve(it["death"], c, L, shape)) for it, c in seq]
    return out


def resolve(d, c, L, shape):
    if d == "E":
        return "E"
    ph, fam, k, pos, low, high, margin = d
    a, b, s = shape[ph]
    cc = copy_of(fam, k, c, L)
    if margin[0] <= cc <= L - 2 - margin[1]:
        return (ph, a + b * cc + pos)
    fb = low if cc < margin[0] else high
    if fb == "V":
        idx = a + b * cc + pos
        if not 0 <= idx < a + b * (L - 1) + s:
            raise ValueError("a death falls outside the phase")
        return (ph, idx)
    if fb == "E":
        return "E"
    fph, region, j = fb
    fa, fb_, _ = shape[fph]
    return (fph, j if region == "P" else fa + fb_ * (L - 1) + j)


def check_generated(canon, shape, run, L):
    gen = generate(canon, shape, L)
    for ph in PHASES:
        want = [(it["token"][0], it["flags"], it["death"]) for it in run[ph]]
        if gen[ph] != want:
            bad = next(i for i, (g, w) in enumerate(zip(gen[ph], want)) if g != w)
            raise ValueError(f"{ph}: the {L}-layer run differs at allocation {bad}: {gen[ph][bad]} vs {want[bad]}")


def check_sizes(canon, shape, run, mo, L):
    gen = generate(canon, shape, L)
    for ph in PHASES:
        for (expr, _, death), it in zip(gen[ph], run[ph]):
            if expr[0] != "K" and sum(mo[m] * c for m, c in expr) != it["bytes"]:
                raise ValueError(f"{ph}: the check model's allocation of {it['bytes']} B is not {expr}")
            if death != it["death"]:
                raise ValueError(f"{ph}: the check model frees an allocation elsewhere")


# ---------------------------------------------------------------- C++


def death_code(d):
    if d == "E":
        return "E"
    ph, fam, k, pos, low, high, margin = d
    fb = lambda f: "" if f == "V" else "E" if f == "E" else f"{f[0][0]}{f[1]}{f[2]}"
    return (f"{ph[0]}{fam}{k}.{pos}" + ("" if margin == (0, 0) else f"^{margin[0]}{margin[1]}") +
            ("" if low == "V" else "<" + fb(low)) + ("" if high == "V" else ">" + fb(high)))


# Item codes: two characters of CODE (89 printable characters: no quote, '?' (trigraphs), backslash or '|').
CODE = "".join(chr(c) for c in range(35, 127) if chr(c) not in "?\\|")


def item_text(x, exprs):
    t = x["one_layer"]
    one = "" if t is None else "/E" if t == "E" else f"/{t[0][0]}{t[1]}"
    return f"{exprs.setdefault(x['expr'], len(exprs))},{x['flags']},{death_code(x['death'])}{one}"


def phase_code(canon, ph, exprs, items):
    """`P|X|S`, each allocation two characters: its index in the architecture's item table."""
    parts = []
    for region in ("P", "X", "S"):
        codes = []
        for x in (x for x in canon[ph] if x["region"] == region):
            i = items.setdefault(item_text(x, exprs), len(items))
            codes.append(CODE[i // len(CODE)] + CODE[i % len(CODE)])
        parts.append("".join(codes))
    return "|".join(parts)


def wrapped(text, width=1500):
    """A long string as adjacent C++ literals of `width` characters, one a line."""
    return "\n".join(f'    "{text[i:i + width]}"' for i in range(0, len(text), width)) or '    ""'


def expr_cpp(e):
    if e[0] == "K":
        return f"{{OrderKind::{e[1]}, {{}}}}"
    terms = ", ".join(f"{{{'One' if m == '1' else m}, {c}}}" for m, c in e)
    return f"{{OrderKind::product, {{{terms}}}}}"


def write_cpp(arch, rows, exprs, items, max_lines=560):
    if len(items) > len(CODE) ** 2:
        raise ValueError(f"{arch}: {len(items)} distinct allocations, more than two characters number")
    import torch
    import transformers
    head = (f"// Written by tools/derive_pytorch_allocation_order.py from traces of HF transformers "
            f"{transformers.__version__} + torch\n// {torch.__version__.split('+')[0]} with the CUDA rules of "
            f"tools/cuda_allocation_rules.py (see fit/framework_pytorch_order.hpp):\n"
            f"// do not edit by hand.\n#include \"fit/framework_pytorch_order.hpp\"\n\n"
            f"namespace memfit::torch_model {{\n\n")
    ex = sorted(exprs.items(), key=lambda kv: kv[1])
    body = "namespace {\n\n// sizes: a product of shapes (bytes per unit) or a formula\nconst OrderExpr kExprs[] = {\n"
    body += "".join(f"    {expr_cpp(e)},\n" for e, _ in ex) + "};\n\n"
    it = [t for t, _ in sorted(items.items(), key=lambda kv: kv[1])]
    body += ("// the allocations, `size,flags,death`, space-separated: item i is coded as two base-89 digits\n"
             "const char* const kItems =\n" + wrapped(" ".join(it)) + ";\n\n")
    body += ("// {llama, eager, checkpointing, bf16, batch1, gqa, mqa, tied}; forward, backward: P|X|S of item codes\n"
             "const OrderVariant kVariants[] = {\n")
    for v, fwd, bwd in rows:
        body += f"    {{{v},\n{wrapped(fwd)},\n{wrapped(bwd)}}},\n"
    body += "};\n\n}  // namespace\n\n"
    body += (f"std::span<const OrderExpr> {arch}_order_exprs() {{ return kExprs; }}\n"
             f"const char* {arch}_order_items() {{ return kItems; }}\n"
             f"std::span<const OrderVariant> {arch}_order_variants() {{ return kVariants; }}\n\n"
             f"}}  // namespace memfit::torch_model\n")
    text = head + body
    if text.count("\n") > max_lines:
        raise ValueError(f"{arch}: {text.count(chr(10))} lines")
    return text


def trace_runs(arch, att, ck, ac, br):
    specs = dm.trace_specs(arch, att, ck, ac, br)
    deeper = []
    for L in (4, 5):
        m = dict(specs[2][0])
        m["n_layer" if arch == "gpt2" else "num_hidden_layers"] = L
        deeper.append((m,) + tuple(specs[2][1:]))
    specs = specs[:3] + deeper + [specs[3]]
    return [run_items(m, B, T, a, c, x) for m, B, T, a, c, x in specs], specs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default="/tmp/pytorch_order_traces")
    ap.add_argument("--only", choices=["gpt2", "llama"])
    ap.add_argument("--variant", help="only this one, e.g. 'gpt2 sdpa 0 0 b3' (nothing is written)")
    args = ap.parse_args()
    os.makedirs(args.cache, exist_ok=True)
    import torch
    torch.set_num_threads(1)
    rows, exprs, items, failed = {"gpt2": [], "llama": []}, {"gpt2": {}, "llama": {}}, {"gpt2": {}, "llama": {}}, []
    for arch, att, ck, ac, br in dm.variants():
        if args.only and arch != args.only:
            continue
        if args.variant and args.variant.split() != [arch, att, str(ck), str(ac), br]:
            continue
        path = os.path.join(args.cache, f"order_{arch}_{att}_{ck}_{ac}_{br}.json")
        specs = None
        if not os.path.exists(path):
            runs, specs = trace_runs(arch, att, ck, ac, br)
            json.dump(dict(runs=runs, specs=specs), open(path, "w"))
        data = json.load(open(path))
        runs, specs = data["runs"], data["specs"]
        for r in runs:
            for ph in PHASES:
                for it in r[ph]:
                    if it["death"] != "E":
                        it["death"] = tuple(it["death"])
        label = f"{arch} {att} ckpt={ck} bf16={ac} {br}"
        try:
            for r, (m, B, T, *_) in zip(runs, specs):
                symbolize(r, dm.monos(*dm.shape_of(m, B, T)))
            canon, shape = derive_variant(runs)
            m, B, T = specs[5][:3]
            check_sizes(canon, shape, runs[5], dm.monos(*dm.shape_of(m, B, T)), dm.rv_layers(dict(m=m)))
        except ValueError as e:
            print(f"{label}: NOT DERIVED: {e}", file=sys.stderr)
            failed.append(label)
            continue
        f = lambda x: "true" if x else "false"
        v = (f"{{{f(arch == 'llama')}, {f(att == 'eager')}, {f(ck)}, {f(ac)}, {f(br.startswith('b1'))}, "
             f"{f('gqa' in br)}, {f('mqa' in br)}, {f('tie' in br)}}}")
        rows[arch].append((v, phase_code(canon, "forward", exprs[arch], items[arch]),
                           phase_code(canon, "backward", exprs[arch], items[arch])))
        print(f"{label}: forward {shape['forward']}, backward {shape['backward']}", file=sys.stderr, flush=True)
    for arch in ("gpt2", "llama"):
        if rows[arch] and not args.variant:
            with open(os.path.join(REPO, "src", "fit", f"framework_pytorch_order_{arch}.cpp"), "w") as fh:
                fh.write(write_cpp(arch, rows[arch], exprs[arch], items[arch]))
    if failed:
        sys.exit(f"{len(failed)} variants not derived")


if __name__ == "__main__":
    main()
