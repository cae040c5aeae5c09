#!/usr/bin/env python3
"""Side-by-side benchmark of one training step (forward, backward, grad clip, AdamW or Muon):
keel against the same model in PyTorch, same shapes, same thread count, in one run; prints both
and their ratio, and peak memory of each. The Muon case also reports the share of the step that
Newton-Schulz takes on each side (PyTorch runs the same Moonlight-form Muon written with torch
ops: fp32 NS5 on each hidden matrix, AdamW on the rest). The *_bf16 cases run keel with
`--precision bf16` and PyTorch's forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)
(fp32 parameters and AdamW on both sides; every peer model below, the nanoGPT-style ones too), and
also time keel in fp32 on the same model to report keel's own bf16/fp32 speed ratio
(docs/precision.md).

The PyTorch side is the fastest PyTorch on the machine for the same model and step: with
--peer auto (the default) every candidate of bench/torch_peers.py (the fixtures' reference model,
a nanoGPT-style nn.Module with for-loop or foreach AdamW, a baddbmm-fused attention) is measured
under both of Debian's OpenBLAS builds (OpenMP and pthread) and the fastest is raced; first, with
--alloc auto, the allocator under PyTorch is chosen the same way (glibc as it comes, glibc told to
keep freed memory, jemalloc told to keep it: see ALLOCATORS) on the first candidate, and once more
under the fastest model, whose allocator it then races. The race
is interleaved and repeated (keel, peer, keel, peer, ...): each pair gives a ratio, and the
median ratio and its spread (min..max over pairs) are reported, with the CPU model and ISA. Every
run is its own process, so each peak RSS is its own.

    /usr/bin/python3 bench/train_step_vs_pytorch.py [--keel build/release/keel] [--cases small,gpt2,large]
        [--repeat 5] [--peer auto|reference|plain|plain_foreach|plain_fused] [--blas auto|openmp|pthread]
        [--alloc auto|glibc|glibc_kept|jemalloc_kept] [--isa as-is|native|avx2]

--isa says what code both sides run. as-is (the default) leaves the environment alone. native
removes the caps some machines set in every shell (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE,
ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY), so each side runs what the CPU has; where OpenBLAS does
not know the CPU and would run kernels narrower than its vectors (Prescott's SSE3 on a 2023 Xeon),
it sets OPENBLAS_CORETYPE to the CPU's own (SkylakeX with AVX-512, Haswell with AVX2) and says so. avx2 races what an
AVX2-only CPU (a Zen 3) runs, on any newer x86-64 machine: keel built for AVX2 (build/avx2/keel
unless --keel says otherwise: `cmake --preset avx2 && cmake --build --preset avx2 --target keel`)
with oneDNN capped at AVX2, and PyTorch with ATen's AVX2 kernels and OpenBLAS's Haswell ones
(OPENBLAS_L2_SIZE, if set, is left as it is).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_KEEL = os.path.join(ROOT, "build/release/keel")

CASES = {
    # name: (config, batch, seq, optimizer)
    "small": ("bench/configs/qwen3_small.json", 8, 256, "adamw"),
    "gpt2": ("bench/configs/gpt2_small.json", 8, 256, "adamw"),
    "large": ("bench/configs/qwen3_large.json", 4, 512, "adamw"),
    # The real GPT-2 124M (12 layers, 768 wide, vocab 50,257) at its full context.
    "gpt2_124m": ("configs/hf/gpt2.json", 4, 1024, "adamw"),
    "muon": ("bench/configs/qwen3_small.json", 8, 256, "muon"),
    "muon_large": ("bench/configs/qwen3_large.json", 4, 512, "muon"),
    # Mixtral-style MoE (8 experts, top-2; PyTorch gathers each expert's tokens as HF does) and
    # DeepSeek-V3-style MLA with dense MLPs.
    "moe": ("bench/configs/mixtral_small.json", 8, 256, "adamw"),
    "mla": ("bench/configs/mla_small.json", 8, 256, "adamw"),
    # bf16 mixed precision (keel --precision bf16; PyTorch autocast bf16).
    "small_bf16": ("bench/configs/qwen3_small.json", 8, 256, "adamw", "bf16"),
    "large_bf16": ("bench/configs/qwen3_large.json", 4, 512, "adamw", "bf16"),
    "moe_bf16": ("bench/configs/mixtral_small.json", 8, 256, "adamw", "bf16"),
    "mla_bf16": ("bench/configs/mla_small.json", 8, 256, "adamw", "bf16"),
}
MUON_SUFFIXES = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                 ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight")


def torch_muon(torch, muon_params, adamw):
    """Moonlight-form Muon (Nesterov 0.95, NS5 in fp32, 0.2*sqrt(max(A, B)), decoupled decay)
    on muon_params; adamw (a torch.optim.AdamW) steps the rest. Returns step() -> NS seconds."""
    a, b, c = 3.4445, -4.7750, 2.0315
    bufs = [torch.zeros_like(p) for p in muon_params]

    def ns5(g):
        x = g.T if g.shape[0] > g.shape[1] else g
        x = x / (x.norm() + 1e-7)
        for _ in range(5):
            A = x @ x.T
            B = b * A + c * (A @ A)
            x = a * x + B @ x
        return x.T if g.shape[0] > g.shape[1] else x

    @torch.no_grad()
    def step(lr=1e-4, wd=0.1, mu=0.95):
        ns = 0.0
        for p, buf in zip(muon_params, bufs):
            buf.mul_(mu).add_(p.grad)
            u = p.grad + mu * buf
            t0 = time.perf_counter()
            o = ns5(u)
            ns += time.perf_counter() - t0
            p.mul_(1 - lr * wd).add_(o, alpha=-lr * 0.2 * max(p.shape) ** 0.5)
        adamw.step()
        return ns
    return step
OPENMP_BLAS = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"  # Debian's libjemalloc2 (install-deps.sh --torch)

# The allocator under PyTorch. Its CPU tensors are malloc'd and freed every op; glibc gives large
# blocks back to the kernel (mmap threshold, heap trim), so every step faults its activations in
# again, and where faults are dear that decides the race (a Zen 5 VM, 2026-12-03: the plain peer at
# 1,922 tok/s as it comes, 3,994 with glibc told to keep memory, 4,257 with jemalloc told to keep
# it; docs/performance.md). keel keeps its own buffers between steps, so the peer may keep its too.
# glibc's settings are its documented environment tunables (mallopt(3)); jemalloc's are its
# MALLOC_CONF options, decay -1: never purge dirty pages.
ALLOCATORS = {
    "glibc": {},
    "glibc_kept": {"MALLOC_MMAP_THRESHOLD_": str(1 << 32), "MALLOC_TRIM_THRESHOLD_": str(1 << 36),
                   "MALLOC_TOP_PAD_": str(1 << 30)},
    "jemalloc_kept": {"LD_PRELOAD": JEMALLOC, "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"},
}


def allocators_here():
    return [a for a in ALLOCATORS if a != "jemalloc_kept" or os.path.exists(JEMALLOC)]


def torch_worker(config, batch, seq, steps, warmup, optimizer, precision="fp32", peer="reference"):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    torch.manual_seed(0)
    cfg = json.load(open(os.path.join(ROOT, config)))
    if peer != "reference":
        import torch_peers
        step, _ = torch_peers.make_plain_step(cfg, batch, seq, peer, precision)
        muon_step = None
    else:
        step, muon_step = reference_step(torch, cfg, batch, seq, optimizer, precision)
    for _ in range(warmup):
        step()
    ns = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        ns += step()
    ms = (time.perf_counter() - start) * 1000.0 / steps
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    out = {"ms_per_step": ms, "tokens_per_s": batch * seq / (ms / 1000.0), "peak_rss_mb": rss,
           "threads": torch.get_num_threads()}
    if muon_step:
        out["ns_ms_per_step"] = ns * 1000.0 / steps
        out["ns_share"] = out["ns_ms_per_step"] / ms
    print(json.dumps(out))


def reference_step(torch, cfg, batch, seq, optimizer, precision):
    import reference_model as ref
    s = ref.resolve(cfg)
    params = {}
    decay, no_decay = [], []
    for name, shape, kind in ref.tensor_layout(s):
        if kind in ("norm_weight",):
            t = torch.ones(shape)
        elif kind in ("norm_bias", "bias"):
            t = torch.zeros(shape)
        else:
            t = torch.randn(shape) * 0.02
        t.requires_grad_(True)
        params[name] = t
        (decay if ref.decays(name, shape, kind) else no_decay).append(t)
    muon_set = {id(params[n]) for n in params if optimizer == "muon" and n.endswith(MUON_SUFFIXES)}
    groups = [{"params": [p for p in decay if id(p) not in muon_set], "weight_decay": 0.1},
              {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    muon_step = torch_muon(torch, [p for p in params.values() if id(p) in muon_set], opt) if muon_set else None
    tokens = torch.randint(0, s["vocab"], (batch, seq))
    plist = list(params.values())

    def step():
        for p in plist:
            p.grad = None
        if precision == "bf16":
            # Autocast: linear/matmul in bf16 on fp32 parameters (their bf16 copies are made per
            # op), reductions as autocast's op lists decide; backward runs outside, as documented.
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits, _ = ref.forward(s, params, tokens, collect_stats=False)
                loss, _ = ref.causal_lm_loss(logits.float(), tokens, s["z_loss"])
        else:
            logits, _ = ref.forward(s, params, tokens, collect_stats=False)
            loss, _ = ref.causal_lm_loss(logits, tokens, s["z_loss"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, 1.0)
        if muon_step:
            return muon_step()
        opt.step()
        return 0.0
    return step, muon_step


def run_torch(config, batch, seq, steps, warmup, threads, optimizer, precision="fp32", peer="reference",
              blas="openmp", alloc="glibc"):
    if alloc not in allocators_here():
        raise SystemExit(f"train_step_vs_pytorch.py: allocator {alloc} is not here (have: {', '.join(allocators_here())}; "
                         "jemalloc comes with scripts/install-deps.sh --torch)")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **ALLOCATORS[alloc])
    if blas == "openmp" and os.path.isdir(OPENMP_BLAS):
        env["LD_LIBRARY_PATH"] = OPENMP_BLAS + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    out = subprocess.run([sys.executable, __file__, "--torch-worker", config, str(batch), str(seq), str(steps),
                          str(warmup), optimizer, precision, peer], env=env, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_keel(keel, config, batch, seq, steps, warmup, threads, optimizer, precision="fp32", extra=()):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([keel, "bench", "--config", os.path.join(ROOT, config), "--batch", str(batch), "--seq",
                          str(seq), "--steps", str(steps), "--warmup", str(warmup), "--optimizer", optimizer,
                          "--precision", precision, "--json", *extra],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def cpuinfo():
    """The first CPU's model name and flags from /proc/cpuinfo."""
    model, flags = "unknown CPU", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return model, flags


def cpu_description():
    """'MODEL NAME (ISA)' from /proc/cpuinfo: the vector extensions that decide keel's kernels."""
    model, flags = cpuinfo()
    isa = [name for flag, name in (("avx2", "AVX2"), ("fma", "FMA"), ("avx512f", "AVX-512"),
                                    ("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX-BF16")) if flag in flags]
    caps = [f"{k}={os.environ[k]}" for k in ISA_CAPS if os.environ.get(k)]
    return (f"{model} ({', '.join(isa) or 'no AVX2'}), {os.cpu_count()} logical CPUs"
            + (f"; kernels set by {', '.join(caps)}" if caps else ""))


# OpenBLAS's kernels by the widest vectors they use (OpenBLAS 0.3.21's DYNAMIC_ARCH core names).
OPENBLAS_AVX512_CORES = {"SkylakeX", "Cooperlake", "SapphireRapids"}
OPENBLAS_AVX2_CORES = OPENBLAS_AVX512_CORES | {"Haswell", "Zen"}


def openblas_detected_core():
    """The kernel set OpenBLAS picks for this CPU by itself (no OPENBLAS_CORETYPE), asked in a
    child process so this one's environment and libraries stay as they are; None if unknown."""
    probe = ("import ctypes\n"
             "l = ctypes.CDLL('libopenblas.so.0')\n"
             "l.openblas_get_corename.restype = ctypes.c_char_p\n"
             "print(l.openblas_get_corename().decode())")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    try:
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def openblas_core_for_this_cpu(flags, detected):
    """OPENBLAS_CORETYPE to set where OpenBLAS does not know this CPU and falls back to kernels
    without AVX2 (OpenBLAS 0.3.21 takes a 2023 Intel Xeon, model 207, for a Prescott: SSE3),
    else None. The peer is then PyTorch on the kernels its BLAS has for this CPU,
    as a BLAS that knew the model would pick; keel's GEMMs (oneDNN) detect the CPU themselves."""
    # Only a fallback below AVX2 is overridden, as keel's own guard (openblas_core_has_avx2)
    # does: an AVX2 family on an AVX-512 CPU (Zen on a Zen 4, say) is OpenBLAS's own choice, and
    # the races on those machines were measured with it.
    if detected is None or detected.lower() in {c.lower() for c in OPENBLAS_AVX2_CORES}:
        return None
    if "avx512f" in flags:
        return "SkylakeX"
    if "avx2" in flags:
        return "Haswell"
    return None


# Environment variables that hold code below what the CPU has: oneDNN's (keel's GEMMs), ATen's
# vectorized kernels and OpenBLAS's kernel choice (PyTorch's). The flags alone would not say.
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "OPENBLAS_CORETYPE")
# --isa avx2: the caps that make both sides run an AVX2-only CPU's code (ISA_CAPS, in order).
AVX2_CAPS = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "OPENBLAS_CORETYPE": "Haswell"}


def apply_isa(isa, keel):
    """Sets this process's environment (which both sides inherit) for --isa; returns the keel
    binary to race: `keel` if given (--keel), else the release build, or the avx2 one for avx2."""
    if keel is None:
        keel = os.path.join(ROOT, "build/avx2/keel") if isa == "avx2" else DEFAULT_KEEL
    if isa == "as-is":
        return keel
    for k in ISA_CAPS:
        os.environ.pop(k, None)
    if isa == "native":
        os.environ.pop("OPENBLAS_L2_SIZE", None)  # OpenBLAS reads the CPU's own cache sizes
        detected = openblas_detected_core()
        core = openblas_core_for_this_cpu(cpuinfo()[1], detected)
        if core is not None:
            print(f"OpenBLAS takes this CPU for a {detected}: OPENBLAS_CORETYPE={core} gives it its own kernels",
                  flush=True)
            os.environ["OPENBLAS_CORETYPE"] = core
        return keel
    os.environ.update(AVX2_CAPS)
    if not os.access(keel, os.X_OK):
        raise SystemExit(f"train_step_vs_pytorch.py: --isa avx2 races keel built for AVX2, and {keel} is not there; "
                         "build it with `cmake --preset avx2 && cmake --build --preset avx2 --target keel`")
    return keel


def check_keel_isa(isa, keel_row):
    """--isa avx2 with a keel binary whose own kernels are AVX-512 would race the wrong code, and
    --isa native with an AVX2 build on a CPU that has AVX-512 too."""
    kernel = keel_row.get("kernels", {}).get("block_gemm", "")
    if isa == "avx2" and not kernel.startswith("avx2"):
        raise SystemExit(f"train_step_vs_pytorch.py: --isa avx2, but this keel binary runs its {kernel or 'unknown'} "
                         "block microkernel: pass --keel with a binary built by `cmake --preset avx2`")
    if isa == "native" and kernel != "avx512" and "AVX-512" in cpu_description():
        raise SystemExit(f"train_step_vs_pytorch.py: --isa native on an AVX-512 CPU, but this keel binary runs its "
                         f"{kernel or 'unknown'} block microkernel: pass --keel with the release build")


def add_keel_arguments(ap):
    """--keel and --isa, shared by the scripts that race keel against PyTorch."""
    ap.add_argument("--keel", default=None, help="keel binary (default: build/release/keel; build/avx2/keel with --isa avx2)")
    ap.add_argument("--isa", default="as-is", choices=["as-is", "native", "avx2"],
                    help="the code both sides run: as the environment says, the CPU's own, or an AVX2-only CPU's")


def resolve_keel(args):
    """Applies --isa and sets args.keel to the binary to race, checked on one short step (the
    binary does not change during a run) before any peer search spends minutes."""
    args.keel = apply_isa(args.isa, args.keel)
    if args.isa != "as-is":
        check_keel_isa(args.isa, run_keel(args.keel, "bench/configs/qwen3_small.json", 1, 64, 1, 0, args.threads,
                                          "adamw"))


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def peer_candidates(config, optimizer, precision, peer, blas):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    # The plain models run bf16 under autocast as the reference does, so they race in bf16 too.
    plain_ok = optimizer == "adamw" and precision in ("fp32", "bf16")
    if plain_ok:
        try:
            import torch_peers  # needs torch; only the config check is used here
            plain_ok = torch_peers.plain_config(json.load(open(os.path.join(ROOT, config)))) is not None
        except ImportError:
            plain_ok = False
    peers = ["reference"] + (["plain", "plain_foreach", "plain_fused"] if plain_ok else [])
    if peer != "auto":
        if peer not in peers:
            raise SystemExit(f"train_step_vs_pytorch.py: --peer {peer} has no model for {config} "
                             f"({optimizer}, {precision}); candidates: {', '.join(peers)}")
        peers = [peer]
    blases = ["openmp", "pthread"] if blas == "auto" else [blas]
    return [(p, b) for p in peers for b in blases]


def choose_peer(args, config, batch, seq, optimizer, precision):
    """The allocator first, on the first (peer, BLAS) candidate, then every (peer, BLAS) candidate
    under it, then the allocators again under the fastest of those (an allocator can suit one
    model and not another, and two allocators within a few percent of each other on the first
    candidate are a coin toss): each --search-repeat times, interleaved; the fastest by median
    tokens/s. Returns (peer, blas, alloc) and the tokens/s seen, by "peer/blas/alloc"."""
    cands = peer_candidates(config, optimizer, precision, args.peer, args.blas)
    allocs = allocators_here() if args.alloc == "auto" else [args.alloc]
    seen = {}

    def search(trials):
        if len(trials) == 1:
            return trials[0]
        for _ in range(args.search_repeat):
            for c in trials:
                seen.setdefault(c, []).append(run_torch(config, batch, seq, args.steps, args.warmup, args.threads,
                                                        optimizer, precision, *c)["tokens_per_s"])
        return max(trials, key=lambda c: median(seen[c]))

    alloc = search([(*cands[0], a) for a in allocs])[2]
    best = search([(*c, alloc) for c in cands])
    if best[:2] != cands[0]:  # the first pass already tried every allocator under cands[0]
        best = search([(*best[:2], a) for a in allocs])
    return best, {"/".join(c): round(median(v), 1) for c, v in seen.items()}


def gemm_ceilings(ks, peer_ms):
    """keel's GEMMs against the FMA peak of the width they run at and against keel's gemm on a
    2,048^3 product (measured by the first run), and the ratio to the peer keel's step would reach
    with every product at each rate, the rest of its step as measured (medians over the runs)."""
    k_ms = median([k["ms_per_step"] for k in ks])
    gemm_ms = median([k["stages_ms"]["gemm"] for k in ks])
    gflop = ks[0]["gemm_gflop_per_step"]
    out = {"gemm_on_bf16_units": ks[0]["gemm_on_bf16_units"], "fma_peak_vector_bits": ks[0]["fma_peak_vector_bits"],
           "fma_peak_threads": ks[0]["fma_peak_threads"]}
    if gemm_ms <= 0:
        return out
    out["gemm_gflops_per_s"] = round(gflop / gemm_ms * 1e3, 1)
    for name, rate in (("fma_peak", ks[0]["fma_peak_gflops_per_s"]), ("square_gemm", ks[0]["square_gemm_gflops_per_s"])):
        if rate:  # None where keel measured no such ceiling
            at = k_ms - gemm_ms + gflop / rate * 1e3
            out.update({f"{name}_gflops_per_s": round(rate, 1), f"gemm_of_{name}": round(gflop / gemm_ms * 1e3 / rate, 3),
                        f"ms_per_step_gemm_at_{name}": round(at, 1), f"speed_ratio_at_{name}": round(peer_ms / at, 3)})
    return out


def race(args, case):
    config, batch, seq, optimizer, *rest = CASES[case]
    precision = rest[0] if rest else "fp32"
    (peer, blas, alloc), searched = choose_peer(args, config, batch, seq, optimizer, precision)
    ks, ts, k32s = [], [], []
    for i in range(args.repeat):
        # The first keel run also measures the GEMMs' ceilings (after its steps; `keel bench --peak`).
        ks.append(run_keel(args.keel, config, batch, seq, args.steps, args.warmup, args.threads, optimizer,
                           precision, extra=("--peak",) if i == 0 else ()))
        ts.append(run_torch(config, batch, seq, args.steps, args.warmup, args.threads, optimizer, precision,
                            peer, blas, alloc))
        if precision == "bf16":
            k32s.append(run_keel(args.keel, config, batch, seq, args.steps, args.warmup, args.threads, optimizer))
    ratios = [k["tokens_per_s"] / t["tokens_per_s"] for k, t in zip(ks, ts)]
    k_tps = median([k["tokens_per_s"] for k in ks])
    t_tps = median([t["tokens_per_s"] for t in ts])
    k_mb = median([k["peak_rss_mb"] for k in ks])
    t_mb = median([t["peak_rss_mb"] for t in ts])
    row = {"case": case, "config": config, "batch": batch, "seq": seq, "optimizer": optimizer,
           "precision": precision, "cpu": cpu_description(), "threads": args.threads, "pairs": args.repeat,
           "peer": peer, "peer_blas": blas, "peer_alloc": alloc, "peer_candidates_tokens_per_s": searched,
           "keel_tokens_per_s": round(k_tps, 1), "torch_tokens_per_s": round(t_tps, 1),
           "speed_ratio": round(median(ratios), 3), "speed_ratio_min": round(min(ratios), 3),
           "speed_ratio_max": round(max(ratios), 3),
           "keel_peak_mb": round(k_mb, 1), "torch_peak_mb": round(t_mb, 1),
           "memory_ratio": round(k_mb / t_mb, 3)}
    if "kernels" in ks[0]:
        row["keel_kernels"] = ks[0]["kernels"]
    if "stages_ms" in ks[0]:
        row["keel_stages_ms"] = {s: round(median([k["stages_ms"][s] for k in ks]), 2) for s in ks[0]["stages_ms"]}
    if "gemm_shapes" in ks[0]:
        # Per shape of product, the median over keel's runs of its time and rate (the runs take the
        # same products; a shape missing from a run counts as absent there).
        def key(g):
            return (g["form"], g["bf16"], g["m"], g["n"], g["k"])
        shapes = []
        for g in ks[0]["gemm_shapes"]:
            runs = [h for k in ks for h in k["gemm_shapes"] if key(h) == key(g)]
            shapes.append({"form": g["form"], "bf16": g["bf16"], "m": g["m"], "n": g["n"], "k": g["k"],
                           "calls_per_step": g["calls_per_step"],
                           "ms_per_step": round(median([h["ms_per_step"] for h in runs]), 2),
                           "gflops_per_s": round(median([h["gflops_per_s"] for h in runs]), 1)})
        row["keel_gemm_shapes"] = sorted(shapes, key=lambda g: -g["ms_per_step"])
    if "stages_ms" in ks[0] and "square_gemm_gflops_per_s" in ks[0]:
        row["keel_gemm_ceilings"] = gemm_ceilings(ks, batch * seq / t_tps * 1e3)
    if optimizer == "muon":
        row.update(keel_ns_share=round(median([k["ns_share"] for k in ks]), 4),
                   torch_ns_share=round(median([t["ns_share"] for t in ts]), 4),
                   keel_ns_ms=round(median([k["ns_ms_per_step"] for k in ks]), 2),
                   torch_ns_ms=round(median([t["ns_ms_per_step"] for t in ts]), 2))
    if precision == "bf16":
        k32 = median([k["tokens_per_s"] for k in k32s])
        row.update(keel_fp32_tokens_per_s=round(k32, 1), keel_bf16_over_fp32=round(k_tps / k32, 3),
                   keel_fp32_peak_mb=round(median([k["peak_rss_mb"] for k in k32s]), 1))
    return row


def print_row(row):
    print(f"{row['case']:6s} B={row['batch']} T={row['seq']}: keel {row['keel_tokens_per_s']:>8.0f} tok/s  "
          f"torch[{row['peer']}/{row['peer_blas']}/{row['peer_alloc']}] {row['torch_tokens_per_s']:>8.0f} tok/s  "
          f"ratio {row['speed_ratio']:.2f}x (median of {row['pairs']} pairs, {row['speed_ratio_min']:.2f}.."
          f"{row['speed_ratio_max']:.2f})  |  peak RSS keel {row['keel_peak_mb']:.0f} MB, "
          f"torch {row['torch_peak_mb']:.0f} MB (ratio {row['memory_ratio']:.2f})", flush=True)
    if "keel_kernels" in row:
        k = row["keel_kernels"]
        print(f"{'':6s} keel ran: block microkernel {k['block_gemm']}, GEMMs {k['gemm_backend']}, "
              f"bf16 GEMMs {k.get('bf16_gemm_path', 'native' if k['bf16_gemm_native'] else 'portable')}", flush=True)
    if row["peer_candidates_tokens_per_s"]:
        print(f"{'':6s} peers searched (tok/s): " +
              ", ".join(f"{k} {v:.0f}" for k, v in row["peer_candidates_tokens_per_s"].items()), flush=True)
    if row["precision"] == "bf16":
        print(f"{'':6s} keel bf16 vs keel fp32 ({row['keel_fp32_tokens_per_s']:.0f} tok/s, "
              f"{row['keel_fp32_peak_mb']:.0f} MB): {row['keel_bf16_over_fp32']:.2f}x", flush=True)
    if row["optimizer"] == "muon":
        print(f"{'':6s} Newton-Schulz per step: keel {row['keel_ns_ms']:.1f} ms "
              f"({100 * row['keel_ns_share']:.1f}% of the step), torch {row['torch_ns_ms']:.1f} ms "
              f"({100 * row['torch_ns_share']:.1f}%)", flush=True)
    if "keel_stages_ms" in row:
        print(f"{'':6s} keel stages (ms/step): " +
              ", ".join(f"{k} {v:.1f}" for k, v in row["keel_stages_ms"].items()), flush=True)
    if "gemm_gflops_per_s" in row.get("keel_gemm_ceilings", {}):
        c = row["keel_gemm_ceilings"]
        parts, ats = [], []
        if "fma_peak_gflops_per_s" in c:
            parts.append(f"{100 * c['gemm_of_fma_peak']:.0f}% of the FMA peak ({c['fma_peak_gflops_per_s']:.0f} GFLOP/s, "
                         f"{c['fma_peak_vector_bits']}-bit, {c['fma_peak_threads']} threads)")
            ats.append(f"the FMA peak keel would be {c['speed_ratio_at_fma_peak']:.2f}x this peer")
        if "square_gemm_gflops_per_s" in c:
            parts.append(f"{100 * c['gemm_of_square_gemm']:.0f}% of keel's gemm at 2048^3 "
                         f"({c['square_gemm_gflops_per_s']:.0f})")
            ats.append(f"the 2048^3 rate {c['speed_ratio_at_square_gemm']:.2f}x")
        line = f"keel GEMMs at {c['gemm_gflops_per_s']:.0f} GFLOP/s"
        if c["gemm_on_bf16_units"]:
            line += " on bf16 dot-product units (no fp32 ceiling bounds them)"
        if parts:
            line += ", " + ", ".join(parts) + "; with every product at " + ", at ".join(ats)
        print(f"{'':6s} {line}", flush=True)
    if row.get("keel_gemm_shapes"):
        print(f"{'':6s} keel GEMMs by shape, most time first (form m x n x k, calls/step: ms/step at GFLOP/s): " +
              "; ".join(f"{g['form']}{' bf16' if g['bf16'] else ''} {g['m']}x{g['n']}x{g['k']}, "
                        f"{g['calls_per_step']:g}: {g['ms_per_step']:.1f} at {g['gflops_per_s']:.0f}"
                        for g in row["keel_gemm_shapes"][:6]), flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        a = sys.argv[2:]
        torch_worker(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), a[5], a[6], a[7])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_keel_arguments(ap)
    ap.add_argument("--cases", default="small,gpt2,large,muon")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved keel/PyTorch pairs per case")
    ap.add_argument("--peer", default="auto", help="PyTorch candidate to race (auto: the fastest measured)")
    ap.add_argument("--blas", default="auto", choices=["auto", "openmp", "pthread"],
                    help="OpenBLAS build under PyTorch (auto: the fastest measured)")
    ap.add_argument("--alloc", default="auto", choices=["auto", *ALLOCATORS],
                    help="allocator under PyTorch (auto: the fastest measured; see ALLOCATORS)")
    ap.add_argument("--search-repeat", type=int, default=2, help="runs of each candidate when --peer/--blas is auto")
    ap.add_argument("--json", action="store_true", help="print one JSON object per case")
    args = ap.parse_args()
    resolve_keel(args)
    if not args.json:
        print(f"CPU: {cpu_description()}; {args.threads} threads each side", flush=True)
    for case in args.cases.split(","):
        row = race(args, case)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print_row(row)


if __name__ == "__main__":
    main()
