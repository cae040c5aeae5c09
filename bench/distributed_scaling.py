#!/usr/bin/env python3
"""Data parallelism on this machine, measured side by side, and projected to many machines.

Measures, interleaved and repeated in one run (A B C A B C ...), the same global batch as
  A  one process × 2 OpenMP threads, grad_accum 2
  B  two ranks × 1 thread each (mpirun, shared memory), grad_accum 1, overlap on
  C  as B with [dist] overlap = false
for the Qwen3-small (d256, 4 layers) and d512 (8 layers) bench models: tokens/s, the time each
step spends in communication that compute did not hide (comm_exposed_s), and the bytes rank 0
sends per step. Then the TCP bandwidth between two network namespaces joined by a veth pair (root
and iproute2; the bytes cross the kernel's TCP stack, not a wire, so it is an upper bound on what
a network gives), and from the measured bytes per step a ring all-reduce cost model projects step
time and efficiency at 8, 64 and 512 machines (docs/distributed.md states the assumptions).

    /usr/bin/python3 bench/distributed_scaling.py [--keel build/release/keel] [--rounds 3] [--json out.json]
"""
import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = {
    # name: (config, sequences per micro-batch, seq_len, steps)
    "qwen3_small": ("bench/configs/qwen3_small.json", 4, 256, 10),
    "d512": ("bench/configs/qwen3_large.json", 2, 512, 8),
}
WARMUP = 2  # steps left out of the medians (first-touch allocation, MPI connection setup)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = next(l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name"))
        flags = next(l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags"))
        isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
        if "avx512_bf16" in flags:
            isa += " + AVX512-BF16"
        return f"{name} ({isa}), {os.cpu_count()} cores"
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def make_dataset(keel, work):
    """A prepared dataset of random words: speed does not depend on which tokens they are."""
    import random
    rng = random.Random(1)
    words = [w for w in "the of and to in a is that for it as was with be by on not he this are or his from at".split()]
    text = "\n<|endoftext|>\n".join(" ".join(rng.choice(words) for _ in range(300)) for _ in range(3000))
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w") as f:
        f.write(text)
    tok = os.path.join(work, "tokenizer.json")
    data = os.path.join(work, "data")
    subprocess.run([keel, "tokenizer", "train", "--text", corpus, "--vocab-size", "512", "--out", tok],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([keel, "data", "prepare", "--text", corpus, "--tokenizer", tok, "--out", data,
                    "--val-fraction", "0.05", "--force"], check=True, stdout=subprocess.DEVNULL)
    return data


def run_config(work, model, data):
    config, sequences, seq_len, steps = MODELS[model]
    path = os.path.join(work, f"{model}.toml")
    with open(path, "w") as f:
        f.write(f"""[run]
steps = {steps}
seed = 1
log_every = 1000
[model]
config = "{os.path.join(ROOT, config)}"
[data]
dataset = "{data}"
[batch]
sequences = {sequences}
seq_len = {seq_len}
[optimizer]
lr = 1e-3
[eval]
every = 0
batches = 1
[checkpoint]
every = 0
""")
    return path


def train(keel, toml, out, arm):
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    if arm == "A":
        env["OMP_NUM_THREADS"] = "2"
        cmd = [keel, "train", "--config", toml, "--set", f"run.out={out}", "--set", "batch.grad_accum=2"]
    else:
        env["OMP_NUM_THREADS"] = "1"
        cmd = [keel, "train", "--config", toml, "--set", f"run.out={out}", "--set", "batch.grad_accum=1",
               "--set", f"dist.overlap={'true' if arm == 'B' else 'false'}", "--nproc", "2"]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(l) for l in f][WARMUP:]
    return {
        "tokens_per_s": statistics.median(l["tokens_per_s"] for l in lines),
        "comm_exposed_s": statistics.median(l.get("comm_exposed_s", 0.0) for l in lines),
        "comm_overlapped_s": statistics.median(l.get("comm_overlapped_s", 0.0) for l in lines),
        "comm_bytes": statistics.median(l.get("comm_bytes", 0) for l in lines),
    }


def measure(keel, work, data, rounds):
    results = {}
    for model in MODELS:
        toml = run_config(work, model, data)
        arms = {"A": [], "B": [], "C": []}
        for r in range(rounds):
            for arm in "ABC":
                arms[arm].append(train(keel, toml, os.path.join(work, f"run-{model}-{arm}"), arm))
                print(f"  {model} round {r + 1} {arm}: {arms[arm][-1]['tokens_per_s']:.0f} tok/s", file=sys.stderr)
        results[model] = arms
    return results


def veth_tcp_bandwidth(megabytes=512):
    """Bytes/s and round-trip seconds of TCP between two namespaces joined by veth; None without root."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return None
    tag = str(os.getpid() % 10000)
    a, b, net = f"kbw-a{tag}", f"kbw-b{tag}", "10.232.7."
    def ip(*args):
        subprocess.run(["ip", *args], check=True)
    try:
        ip("netns", "add", a)
        ip("netns", "add", b)
        ip("link", "add", f"kbwa{tag}", "type", "veth", "peer", "name", f"kbwb{tag}")
        ip("link", "set", f"kbwa{tag}", "netns", a)
        ip("link", "set", f"kbwb{tag}", "netns", b)
        ip("-n", a, "addr", "add", net + "1/24", "dev", f"kbwa{tag}")
        ip("-n", b, "addr", "add", net + "2/24", "dev", f"kbwb{tag}")
        ip("-n", a, "link", "set", f"kbwa{tag}", "up")
        ip("-n", b, "link", "set", f"kbwb{tag}", "up")
        server = (
            "import socket,sys,time\n"
            "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('" + net + "2',5599));s.listen(1)\n"
            "c,_=s.accept()\n"
            "for _ in range(200):\n  d=c.recv(1)\n  c.sendall(d)\n"
            "n=0\nwhile True:\n  d=c.recv(1<<20)\n  if not d: break\n  n+=len(d)\n"
            "print(n)\n")
        client = (
            "import socket,time\n"
            "for i in range(50):\n  try:\n    c=socket.create_connection(('" + net + "2',5599));break\n  except OSError: time.sleep(0.1)\n"
            "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
            "t=time.perf_counter()\n"
            "for _ in range(200):\n  c.sendall(b'x');c.recv(1)\n"
            "rtt=(time.perf_counter()-t)/200\n"
            "buf=b'\\0'*(1<<22)\nt=time.perf_counter()\n"
            f"for _ in range({megabytes // 4}):\n  c.sendall(buf)\n"
            "c.shutdown(socket.SHUT_WR);c.recv(1)\nel=time.perf_counter()-t\n"
            f"print({megabytes}*2**20/el, rtt)\n")
        srv = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", server], stdout=subprocess.PIPE, text=True)
        out = subprocess.run(["ip", "netns", "exec", a, sys.executable, "-c", client], check=True, capture_output=True,
                             text=True).stdout.split()
        srv.wait(timeout=60)
        return {"bytes_per_s": float(out[0]), "rtt_s": float(out[1])}
    finally:
        subprocess.run(["ip", "netns", "del", a], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", b], stderr=subprocess.DEVNULL)


def project(step_s, param_bytes, bandwidth, latency, overlap_fraction, machines, buckets):
    """Ring all-reduce cost (reduce-scatter + all-gather, as ZeRO-1 does): each machine sends
    2·(N−1)/N of the parameter bytes per step. keel's reduce-scatter is one all-to-all per bucket
    (a block each, plus the embeddings and head) and its all-gather one more collective, each
    N−1 messages deep: (buckets + 1)·(N−1) latencies. Weak scaling (each machine keeps its batch),
    so compute per machine stays step_s; the measured overlap fraction of the exposed communication
    is hidden. Returns (step time, efficiency)."""
    n = machines
    comm = 2 * (n - 1) / n * param_bytes / bandwidth + (buckets + 1) * (n - 1) * latency
    exposed = comm * (1 - overlap_fraction)
    return step_s + exposed, step_s / (step_s + exposed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keel", default=os.path.join(ROOT, "build/release/keel"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="", help="write the measurements and projection here")
    ap.add_argument("--from-json", default="", help="recompute the tables from an earlier --json")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        cpu, results, bw = saved["cpu"], saved["raw"], saved["veth_tcp"]
        print(f"CPU: {cpu} (measured earlier: {args.from_json})")
    else:
        keel = os.path.abspath(args.keel)
        work = tempfile.mkdtemp(prefix="keel-dist-bench-")
        try:
            cpu = cpu_name()
            print(f"CPU: {cpu}")
            data = make_dataset(keel, work)
            results = measure(keel, work, data, args.rounds)
            bw = veth_tcp_bandwidth()
        finally:
            shutil.rmtree(work, ignore_errors=True)

    report = {"cpu": cpu, "models": {}, "veth_tcp": bw, "raw": results}
    print("\n| model | arm | tokens/s (median of rounds) | spread | exposed comm / step | bytes sent / step (rank 0) |")
    print("|---|---|---|---|---|---|")
    for model, arms in results.items():
        summary = {}
        for arm, runs in arms.items():
            tps = [r["tokens_per_s"] for r in runs]
            summary[arm] = {
                "tokens_per_s": statistics.median(tps), "min": min(tps), "max": max(tps),
                "comm_exposed_s": statistics.median(r["comm_exposed_s"] for r in runs),
                "comm_bytes": statistics.median(r["comm_bytes"] for r in runs),
            }
            label = {"A": "1 rank × 2 threads", "B": "2 ranks × 1 thread, overlap", "C": "2 ranks × 1 thread, no overlap"}[arm]
            s = summary[arm]
            print(f"| {model} | {label} | {s['tokens_per_s']:,.0f} | {s['min']:,.0f}–{s['max']:,.0f} | "
                  f"{s['comm_exposed_s'] * 1e3:.1f} ms | {s['comm_bytes'] / 2**20:.2f} MiB |")
        ratios = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(arms["A"], arms["B"])]
        summary["ratio_B_over_A"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        saved = summary["C"]["comm_exposed_s"] - summary["B"]["comm_exposed_s"]
        summary["overlap_saves_s"] = saved
        summary["overlap_fraction"] = max(0.0, min(0.95, saved / summary["C"]["comm_exposed_s"])) if summary["C"]["comm_exposed_s"] > 0 else 0.0
        report["models"][model] = summary
        print(f"\n{model}: 2 ranks × 1 thread / 1 rank × 2 threads = {summary['ratio_B_over_A']['median']:.3f} "
              f"(rounds {summary['ratio_B_over_A']['min']:.3f}–{summary['ratio_B_over_A']['max']:.3f}); "
              f"overlap hides {saved * 1e3:.1f} ms of {summary['C']['comm_exposed_s'] * 1e3:.1f} ms exposed per step")

    if bw:
        print(f"\nveth TCP between two namespaces: {bw['bytes_per_s'] / 1e9:.2f} GB/s, round trip {bw['rtt_s'] * 1e6:.0f} µs")
    # Projection: the d512 step's compute rate carries to an 8B model (FLOPs ≈ 6·P per token).
    small, big = report["models"]["qwen3_small"], report["models"]["d512"]
    d512_tokens_per_s = big["A"]["tokens_per_s"]
    d512_params = big["B"]["comm_bytes"] / 4  # ZeRO-1 at N=2: rank 0 sends half the grads and half the params
    flops_per_s = 6 * d512_params * d512_tokens_per_s
    links = [("25 Gb/s Ethernet (assumed)", 25e9 / 8, 20e-6)]
    if bw:
        links.insert(0, ("veth TCP (measured)", bw["bytes_per_s"], bw["rtt_s"] / 2))
    cases = []
    for model, summ, tokens_per_step, blocks in [
            ("qwen3_small", small, MODELS["qwen3_small"][1] * MODELS["qwen3_small"][2] * 2, 4),
            ("d512", big, MODELS["d512"][1] * MODELS["d512"][2] * 2, 8)]:
        cases.append((model, tokens_per_step / summ["A"]["tokens_per_s"], summ["B"]["comm_bytes"], summ["overlap_fraction"],
                      blocks + 1))
    # 8B: Llama-3-8B's 8.03 B parameters and 32 blocks; 2 sequences of 1,024 tokens per machine and
    # step at the d512 run's measured FLOP rate (6 FLOPs per parameter and token; attention's
    # extra FLOPs at 1,024 tokens are left out).
    eight_b_tokens = 2 * 1024
    cases.append(("8B (Llama-3-8B shape)", 6 * 8.03e9 * eight_b_tokens / flops_per_s, 8.03e9 * 4, big["overlap_fraction"], 33))
    print("\n| model | per-machine step (compute) | link | N = 8 | N = 64 | N = 512 |")
    print("|---|---|---|---|---|---|")
    report["projection"] = []
    print(f"(compute rate carried to 8B: {flops_per_s / 1e9:.0f} GFLOP/s per machine)")
    for model, step_s, param_bytes, f, buckets in cases:
        for link, bandwidth, latency in links:
            cells = []
            for n in (8, 64, 512):
                t, e = project(step_s, param_bytes, bandwidth, latency, f, n, buckets)
                cells.append(f"{t:.3g} s, {e * 100:.0f}%")
                report["projection"].append({"model": model, "link": link, "machines": n, "step_s": t, "efficiency": e})
            print(f"| {model} | {step_s:.3g} s | {link} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
