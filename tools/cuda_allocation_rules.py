"""The CUDA allocation sequence of an HF training step, from a CPU run of the same code.

torch's profiler (profile_memory=True) gives, on the CPU, every allocation and free of one HF
transformers + PyTorch training step. The CUDA run of the same step (the traces of
tools/record_cuda_allocator_traces.py: H200, torch 2.11, transformers 5.17) allocates the same
tensors in the same order but for a known set of differences, which this module applies. Some
while recording (the CPU then runs what CUDA runs), the rest on the recorded sequence:

While recording (install()):
  R1 fused dropout: CUDA's native_dropout keeps a bool mask (allocated before the output) and
     its backward allocates the gradient alone; CPU dropout keeps a mask in the input's dtype.
  R2 scaled_dot_product_attention runs the kernel CUDA picks on an H100/H200: cuDNN for bf16/fp16
     (seed and offset on the device, the output laid out as q, a log-sum-exp of B x H x T floats,
     a 256-byte workspace; backward: dq, dk, dv and one workspace of (1, or 2 with grouped K/V
     heads) x N x heads x head_dim x 4 + B x heads x T x 4 + 256 bytes), the memory-efficient
     kernel for fp32 (output B x T x heads x head_dim, log-sum-exp with T rounded up to 32;
     backward: dq, dk, dv, an output-sized and two log-sum-exp-sized buffers and a workspace of
     B x heads x roundup(T, 128) x head_dim x 4 + B x heads x T / 4 bytes), the math path for fp32
     with grouped K/V heads (the efficient kernel takes no GQA). Autocast casts its arguments
     right to left, as the C++ wrapper does.
  R3 autocast follows CUDA's policy where the CPU's differs: pow, softmax, layer_norm, ... in fp32.
On the recorded sequence (transform()):
  R4 CPU-only allocations go: Python's wrapped numbers and scalars converted for CPU kernels
     (<= 8 bytes), AdamW's step counters (CPU tensors on CUDA too), torch.utils.checkpoint's saved
     CPU RNG state (5056 bytes), oneDNN's reorder buffers inside a product, LayerNorm backward's
     per-thread buffers, the CPU's copies for mixed-dtype arithmetic and cat.
  R5 each thread's first cuBLAS call allocates its workspace (32 MiB on compute capability 9.x;
     the forward's thread and autograd's), the first cuBLASLt call (addmm with a bias) 1 MiB more.
  R6 a sum over the rows of an N x F gradient (biases, norm weights) that CUDA reduces across
     thread blocks allocates a staging buffer and semaphores (Reduce.cuh's configuration for the
     device's 132 SMs of 2048 threads), freed at once.
  R7 softmax backward allocates a second gradient-sized buffer, freed at once.
  R8 embedding backward with more than 3072 indices sorts them (EmbeddingBackwardKernel.cu):
     index buffers, cub's temporaries and the per-segment partial gradients.
The model load (each parameter and buffer copied to the device in Module._apply's order) is
emulated by cloning. With these rules the 12 recorded configurations replay through
fit/caching_allocator's model to their max_memory_reserved (docs/benchmarks.md).
"""
import os

import torch
import torch.nn.functional as F

LOW = (torch.bfloat16, torch.float16)
_orig_dropout = F.dropout
_orig_sdpa = F.scaled_dot_product_attention


def kind(name):
    """Marks the allocations inside as sized by a formula or a constant, not a product of shapes
    (for the derivation)."""
    return torch.profiler.record_function("KIND:" + name)


class FusedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        mask = torch.empty(x.shape, dtype=torch.bool)
        out = torch.empty_like(x)
        out.copy_(x)
        ctx.save_for_backward(mask)
        return out

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors  # unpacked first, as CUDA's backward does (checkpointing recomputes here)
        gi = torch.empty_like(g)
        gi.copy_(g)
        return gi, None


def dropout(input, p=0.5, training=True, inplace=False):
    if training and 0.0 < p < 1.0 and not inplace:
        return FusedDropout.apply(input, p)
    return _orig_dropout(input, p, training, inplace)


def like_layout(t):
    """A new tensor of t's sizes whose strides follow t's order (what CUDA kernels allocate
    "with matching layout"); contiguous when t is."""
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    base = torch.empty([t.shape[d] for d in order], dtype=t.dtype)
    return base.permute([order.index(d) for d in range(t.dim())])


def bthd(B, T, H, D, dtype):  # a (B, T, H, D) buffer seen as (B, H, T, D)
    return torch.empty((B, T, H, D), dtype=dtype).transpose(1, 2)


def lse32_bytes(B, H, T):
    return B * H * ((T + 31) // 32 * 32) * 4


def efficient_workspace_bytes(B, H, T, D):
    return B * H * ((T + 127) // 128 * 128) * D * 4 + B * H * T // 4


def cudnn_workspace_bytes(B, H, T, D, gqa):
    return (2 if gqa else 1) * B * T * H * D * 4 + B * H * T * 4 + 256


class EfficientAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        B, H, T, D = q.shape
        out = bthd(B, T, H, v.shape[-1], q.dtype)
        with kind("lse32"):
            lse = torch.empty(lse32_bytes(B, H, T), dtype=torch.uint8)
        out.zero_()
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        B, H, T, D = q.shape
        gq, gk, gv = (bthd(t.shape[0], t.shape[2], t.shape[1], t.shape[3], t.dtype) for t in (q, k, v))
        x = torch.empty(out.shape, dtype=out.dtype)
        with kind("lse32"):
            delta = torch.empty(lse.shape, dtype=torch.uint8)
            y = torch.empty(lse.shape, dtype=torch.uint8)
        del delta, x
        with kind("effws"):
            w = torch.empty(efficient_workspace_bytes(B, H, T, D), dtype=torch.uint8)
        del y, w
        for t in (gq, gk, gv):
            t.zero_()
        return gq, gk, gv


class CudnnAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        B, H, T, D = q.shape
        with kind("const"):
            seed = torch.empty((), dtype=torch.int64)
            offset = torch.empty((), dtype=torch.int64)
        out = like_layout(q)
        lse = torch.empty((B, H, T, 1), dtype=torch.float32)
        with kind("const"):
            ws = torch.empty(256, dtype=torch.uint8)
        del ws
        out.zero_()
        ctx.save_for_backward(q, k, v, out, lse, seed, offset)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse, seed, offset = ctx.saved_tensors
        B, H, T, D = q.shape
        gq, gk, gv = like_layout(q), like_layout(k), like_layout(v)
        with kind("cudnnws_gqa" if k.shape[1] != H else "cudnnws"):
            ws = torch.empty(cudnn_workspace_bytes(B, H, T, D, k.shape[1] != H), dtype=torch.uint8)
        del ws
        for t in (gq, gk, gv):
            t.zero_()
        return gq, gk, gv


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if torch.is_autocast_enabled("cpu"):
        dt = torch.get_autocast_dtype("cpu")
        value, key, query = (t.to(dt) if t.dtype == torch.float32 else t for t in (value, key, query))
    with torch.autocast("cpu", enabled=False):
        gqa = key.shape[1] != query.shape[1]
        if attn_mask is None and query.dtype in LOW and query.shape[-1] <= 128:
            return CudnnAttention.apply(query, key, value)
        if attn_mask is None and query.dtype == torch.float32 and not gqa:
            return EfficientAttention.apply(query, key, value)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.MATH):
            return _orig_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa)


_lib = None
FP32_OPS = ["pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "layer_norm", "native_layer_norm", "rsqrt",
            "exp", "log", "log1p", "acos", "asin", "cosh", "erfinv", "expm1", "log10", "log2", "reciprocal", "sinh",
            "tan", "softplus", "group_norm", "nll_loss", "logsumexp", "mse_loss", "l1_loss",
            "binary_cross_entropy_with_logits"]
SET_OPT_DTYPE = ["softmax.int", "log_softmax.int", "sum", "sum.dim_IntList", "cumsum", "prod"]


def _install_autocast():
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    excl = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def up(a):
        return a.float() if isinstance(a, torch.Tensor) and a.dtype in LOW else a

    def fp32_kernel(op):
        def k(*args, **kwargs):
            with torch._C._ExcludeDispatchKeyGuard(excl):
                return op(*[up(a) for a in args], **{n: up(a) for n, a in kwargs.items()})
        return k

    def opt_dtype_kernel(op, pos):
        def k(*args, **kwargs):
            args = list(args)
            with torch._C._ExcludeDispatchKeyGuard(excl):
                if isinstance(args[0], torch.Tensor) and args[0].dtype in LOW:
                    if pos is not None and len(args) > pos:
                        if args[pos] is None:
                            args[pos] = torch.float32
                    elif kwargs.get("dtype") is None:
                        kwargs["dtype"] = torch.float32
                return op(*args, **kwargs)
        return k

    def op_of(name):
        base, _, ov = name.partition(".")
        return getattr(getattr(torch.ops.aten, base), ov or "default")

    for name in FP32_OPS:
        _lib.impl(name, fp32_kernel(op_of(name)), "AutocastCPU")
    for name in SET_OPT_DTYPE:
        pos = 2 if name.split(".")[0] in ("softmax", "log_softmax") else None
        _lib.impl(name, opt_dtype_kernel(op_of(name), pos), "AutocastCPU")


def install():
    F.dropout = dropout
    F.scaled_dot_product_attention = sdpa
    _install_autocast()


# ---------------------------------------------------------------- recording


def flatten(tree):
    """Allocations and frees in time order: (time, ptr, bytes, op stack, innermost op's input shapes,
    embedding_dense_backward's input shapes if inside it)."""
    from torch._C._profiler import _EventType
    out = []

    def walk(n, stack, shapes, emb):
        if n.tag == _EventType.Allocation:
            f = n.extra_fields
            out.append((n.start_time_ns, f.ptr, f.alloc_size, stack, shapes, emb))
            return
        if n.tag == _EventType.TorchOp:
            shapes = [list(t.sizes) if hasattr(t, "sizes") else None for t in n.extra_fields.inputs]
            stack = stack + [f"{n.name}@{n.start_time_ns}"]
            if n.name == "aten::embedding_dense_backward":
                emb = shapes
        for c in n.children:
            walk(c, stack, shapes, emb)

    for r in tree:
        walk(r, [], None, None)
    out.sort(key=lambda x: x[0])
    return out


def record(model, batch, seq, checkpointing, autocast, steps=2, load=True):
    """The allocation events of `steps` training steps of `model` (an HF model in train mode), as
    record_cuda_allocator_traces.py runs them: allocations [bytes, stack, shapes, emb], frees [-k, stack]."""
    from torch.profiler import ProfilerActivity, profile
    install()
    moved = set()

    def to_device(t):  # Module.cuda(): a tensor already moved (tied weights) is not copied again
        if t.data_ptr() in moved:
            return t
        c = t.clone()
        moved.add(c.data_ptr())
        return c

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        if load:
            with torch.profiler.record_function("PHASE_load"):
                model._apply(to_device)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        vocab = model.config.vocab_size
        for step in range(steps):
            with torch.profiler.record_function(f"PHASE_ids{step}"):
                ids = torch.randint(0, vocab, (batch, seq))
            with torch.profiler.record_function(f"PHASE_forward{step}"):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    loss = model(input_ids=ids, labels=ids).loss
            with torch.profiler.record_function(f"PHASE_backward{step}"):
                loss.backward()
            with torch.profiler.record_function(f"PHASE_step{step}"):
                opt.step()
            with torch.profiler.record_function(f"PHASE_zero{step}"):
                opt.zero_grad(set_to_none=True)
            with torch.profiler.record_function(f"PHASE_del{step}"):
                del loss, ids
    live, events, nalloc = {}, [], 0
    for _, ptr, size, stack, shapes, emb in flatten(prof.profiler.kineto_results.experimental_event_tree()):
        if size > 0:
            live[ptr] = nalloc
            events.append([size, stack, shapes, emb])
            nalloc += 1
        else:
            k = live.pop(ptr, None)
            if k is not None:
                events.append([-k, stack])
    return events


# ---------------------------------------------------------------- the rules on the sequence

GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
ARITH = {"aten::add", "aten::mul", "aten::sub", "aten::div", "aten::rsub", "aten::add_", "aten::mul_", "aten::sub_",
         "aten::div_", "aten::where", "aten::addcmul", "aten::addcdiv", "aten::maximum", "aten::minimum", "aten::cat"}
SCALAR_OPS = {"", "aten::mul", "aten::div", "aten::div_", "aten::add", "aten::add_", "aten::mul_", "aten::sub",
              "aten::rsub", "aten::sub_"}
ALLOC_OPS = ("aten::empty", "aten::empty_strided", "aten::resize_")
CUBLAS_WORKSPACE, CUBLASLT_WORKSPACE = 32 << 20, 1 << 20
NUM_SM, THREADS_PER_SM = 132, 2048  # H100 SXM and H200
CUB_TEMP = 1279


def cdiv(a, b):
    return -(-a // b)


def last_pow2(n):
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def staging_bytes(R, F):
    """Reduce.cuh's setReductionConfig for summing R rows of F contiguous columns into F outputs
    (float accumulation): the global staging buffer's and semaphores' bytes, (0, 0) when the
    reduction stays inside thread blocks."""
    vec = 4
    while vec > 1 and F % vec:
        vec //= 2
    dim0, mt = F // vec, 512 // vec
    d0 = last_pow2(dim0) if dim0 < mt else mt
    d1 = last_pow2(R) if R < mt else mt
    bw = min(d0, 32)
    bh = min(d1, mt // bw)
    bw = min(d0, mt // bh)
    if R < min(bh * 16, 256):
        return 0, 0
    grid = cdiv(dim0, bw)
    target = NUM_SM * (THREADS_PER_SM // (bw * bh))
    vpt = cdiv(R, bh)
    if vpt >= 256 and grid <= target:
        c = max(cdiv(vpt, 256), min(cdiv(target, grid), cdiv(vpt, 16)))
        if c > 1:
            return 4 * F * c * bw * vec, 4 * grid
    return 0, 0


def sort_temp_bytes(N):
    # cub's radix-sort temporary storage: 83,455 B at 4096 indices, 150,015 B at 8192 (the traces); linear
    return int(83455 + (150015 - 83455) * (N - 4096) / 4096)


def name(s):
    return s.split("@")[0]


def phase_of(stack):
    for s in stack:
        if s.startswith("PHASE_"):
            return name(s)[6:]
    return ""


def classify(events):
    """For each CPU allocation: None if CUDA makes no such allocation (R4), else its flags:
    gemm / addmm (a product's output: R5), sum_rows (R, F) (R6), softmax_bwd (R7), embedding (N, C)
    (R8), and its kind (KIND: markers) if any."""
    free_stack, free_phase = {}, {}
    for ev in events:
        if ev[0] <= 0:
            free_stack[-ev[0]] = set(ev[1])
            free_phase[-ev[0]] = phase_of(ev[1])
    out, idx = [], 0
    for ev in events:
        if ev[0] <= 0:
            continue
        e, st, shapes, emb = ev
        my = idx
        idx += 1
        ops = [s for s in st if not s.startswith("PHASE_") and not s.startswith("KIND:")]
        names = [name(o) for o in ops]
        inner = names[-1] if names else ""
        if drop(e, ops, names, inner, free_stack.get(my, ())):
            out.append(None)
            continue
        f = {"kind": next((name(s)[5:] for s in st if s.startswith("KIND:")), None)}
        g = inner if inner in GEMM else names[-2] if len(names) > 1 and names[-2] in GEMM and inner in ALLOC_OPS else None
        if g:
            f["gemm"] = True
            f["addmm"] = g == "aten::addmm"
        if inner == "aten::sum" and shapes and shapes[0] and len(shapes[0]) >= 2:
            F_ = shapes[0][-1]
            R = 1
            for d in shapes[0][:-1]:
                R *= d
            # a sum over the rows when the result has F elements; where R == F too, the bias of a
            # product (AddmmBackward0) or a parameter's gradient (kept until zero_grad)
            bias = any(x.endswith("AddmmBackward0") for x in names)
            if e in (4 * F_, 2 * F_) and (R != F_ or bias or free_phase.get(my, "zero").startswith("zero")):
                f["sum_rows"] = (R, F_)
        if inner == "aten::_softmax_backward_data":
            f["softmax_bwd"] = True
        if emb is not None and "aten::embedding_dense_backward" in names and inner in ("aten::empty", "aten::zeros"):
            N = 1
            for d in emb[1]:
                N *= d
            f["embedding"] = (N, emb[0][-1])
        out.append(f)
    return out


def drop(e, ops, names, inner, freed_in):
    if not any(x.startswith("aten::") for x in names) and (e <= 8 or e == 5056):
        return True  # Python's wrapped numbers; torch.utils.checkpoint's saved CPU RNG state
    if e <= 8:
        if ops and ops[-1] in freed_in:
            return True  # a Scalar argument wrapped for the CPU kernel and freed before the op returns
        parent = names[-2] if len(names) > 1 else ""
        if inner in SCALAR_OPS or ("aten::_to_copy" in names[-2:] and parent != "") or \
                any(x.startswith("Optimizer.step") for x in names) or \
                (inner == "aten::empty_strided" and "aten::_to_copy" in names):
            return True  # scalars converted for CPU kernels; AdamW's step counters
    if "aten::_to_copy" not in names and any(name(o) in GEMM and o in freed_in for o in ops):
        return True  # oneDNN's reorder buffers, allocated and freed inside one product
    if inner == "aten::empty_strided" and len(names) >= 4 and names[-3:-1] == ["aten::to", "aten::_to_copy"] and \
            names[-4] in ARITH:
        return True  # the CPU's copies for mixed-dtype arithmetic; CUDA's kernels convert as they load
    if inner == "aten::resize_" and "aten::native_layer_norm_backward" in names:
        return True  # the CPU kernel's per-thread gamma/beta buffers
    return False


def cuda_sequence(events, rules=("R5", "R6", "R7", "R8")):
    """The CUDA request sequence in the traces.json encoding (n > 0 allocates, n <= 0 frees block -n),
    and a label per allocation."""
    flags = classify(events)
    out, labels, newid = [], [], {}
    seen_ws, seen_lt = set(), set()

    def add(size, label):
        out.append(size)
        labels.append(label)
        return len(labels) - 1

    idx = 0
    for ev in events:
        if ev[0] <= 0:
            k = newid.pop(-ev[0], None)
            if k is not None:
                out.append(-k)
            continue
        f, e, ph = flags[idx], ev[0], phase_of(ev[1])
        my = idx
        idx += 1
        if f is None:
            continue
        pend = None
        if "R8" in rules and "embedding" in f and f["embedding"][0] > 3072:
            N = f["embedding"][0]
            i1, i2, i3 = add(8 * N, "emb-sorted"), add(8 * N, "emb-orig"), add(8 * N, "emb-iota")
            t = add(sort_temp_bytes(N), "emb-sort-temp")
            out.extend([-t, -i3])
            pend = (i1, i2)
        newid[my] = add(e, ph)
        thread = "fwd" if ph.startswith("forward") else "bwd" if ph.startswith("backward") else None
        if "R5" in rules and thread and f.get("gemm"):
            if thread not in seen_ws:
                seen_ws.add(thread)
                add(CUBLAS_WORKSPACE, "cublas-workspace")
            if f.get("addmm") and thread not in seen_lt:
                seen_lt.add(thread)
                add(CUBLASLT_WORKSPACE, "cublaslt-workspace")
        if "R7" in rules and f.get("softmax_bwd"):
            out.append(-add(e, "softmax-backward-temp"))
        if "R6" in rules and "sum_rows" in f:
            sb, sem = staging_bytes(*f["sum_rows"])
            if sb:
                a, b = add(sb, "reduce-staging"), add(sem, "reduce-semaphores")
                out.extend([-b, -a])
        if pend:
            embedding_tail(add, out, f["embedding"], e, pend)
    return out, labels


def embedding_tail(add, out, emb, grad_bytes, pend):
    """What EmbeddingBackwardKernel.cu allocates after the gradient: segment offsets, cub's scans,
    the partial segments and their gradients; all freed before it returns."""
    N, C = emb
    V = grad_bytes // (4 * C)
    maxp = N // 10 + min(N, V)
    so, ns, tmp = add(8 * N, "emb-seg-offsets"), add(8, "emb-nseg"), add(8 * N, "emb-tmp")
    ct = add(CUB_TEMP, "emb-cub-temp")
    out.extend([-ct, -tmp])
    p1, p2 = add(8 * min(N, V), "emb-partials"), add(8 * min(N, V), "emb-partial-offsets")
    out.append(-add(CUB_TEMP, "emb-cub-temp"))
    n2, po, buf = add(8, "emb-npartial"), add(8 * maxp, "emb-partial-offset"), add(4 * C * maxp, "emb-partial-grads")
    out.extend([-buf, -po, -n2, -p2, -p1, -ns, -so, -pend[1], -pend[0]])


def check_traces(out_path, only=None):
    """Record the 12 configurations of record_cuda_allocator_traces.py on this CPU, apply the rules
    and write the sequences in the traces.json encoding with the recorded peaks (each in its own
    process; about 10 minutes on one core)."""
    import json
    import subprocess
    import sys
    import record_cuda_allocator_traces as rec
    recorded = json.load(open(os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "cuda_allocator",
                                           "traces.json")))["configurations"]
    out = []
    for i in range(len(rec.CONFIGS)):
        if only is not None and i not in only:
            continue
        r = subprocess.run([sys.executable, __file__, "--one", str(i)], capture_output=True, text=True, check=True)
        events = json.loads(r.stdout)
        c = recorded[i]
        out.append(dict(index=i, model=c["model"], batch=c["batch"], seq=c["seq"], attention=c["attention"],
                        checkpointing=c["checkpointing"], autocast_bf16=c["autocast_bf16"],
                        max_memory_reserved=c["max_memory_reserved"], max_memory_allocated=c["max_memory_allocated"],
                        events=events))
        print(f"config {i}: {len(events)} events", file=sys.stderr, flush=True)
    with open(out_path, "w") as f:
        json.dump({"configurations": out}, f, separators=(",", ":"))


def one(i):
    import record_cuda_allocator_traces as rec
    torch.set_num_threads(1)
    model_cfg, batch, seq, attention, checkpointing, autocast = rec.CONFIGS[i]
    torch.manual_seed(0)
    model = rec.build(model_cfg, attention).train()
    return cuda_sequence(record(model, batch, seq, checkpointing, autocast))[0]


if __name__ == "__main__":
    import argparse
    import json
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description="Stage-1 check: the 12 traced configurations, recorded on the CPU "
                                             "with the rules applied, in traces.json's encoding")
    ap.add_argument("--one", type=int)
    ap.add_argument("--out", default="/tmp/cuda_rules_check.json")
    ap.add_argument("--only", help="comma-separated configuration indices")
    args = ap.parse_args()
    if args.one is not None:
        json.dump(one(args.one), sys.stdout)
    else:
        check_traces(args.out, None if args.only is None else {int(x) for x in args.only.split(",")})
