#!/usr/bin/env python3
"""The attention-logit study's numbers (README.md in this folder), from its run folders (stdlib only).

    python3 experiments/logit_control/analyze.py runs/logit_control [--tau 100 --tau 30]

Per run: steps, final and best validation loss, the median training loss of the last 41 steps,
the largest rise of the 10-step median training loss above its running minimum (the "unstable"
criterion of the other studies), the peak max attention logit (and its step), the final max
logit, the share of (layer, head) pairs whose max logit ever exceeded each tau, the share of
head-steps above the first tau, spike events, and whether the run aborted or went non-finite.
The max logit is the largest scaled q·k/sqrt(d) over unmasked positions, recorded before any
soft-cap; sinks are not q·k logits and are not in it.
"""
import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from summarize import read_jsonl  # noqa: E402  (experiments/summarize.py)


def finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)


def summarize(run, taus):
    m = read_jsonl(os.path.join(run, "metrics.jsonl"))
    ev = read_jsonl(os.path.join(run, "events.jsonl"))
    if not m:
        return None
    losses = [x.get("loss") for x in m]
    vals = [x["val_loss"] for x in m if finite(x.get("val_loss"))]
    rise, running_min = 0.0, math.inf
    for i in range(10, len(losses)):
        window = [v for v in losses[i - 9:i + 1] if finite(v)]
        if len(window) < 10:
            continue
        med = statistics.median(window)
        running_min = min(running_min, med)
        rise = max(rise, med - running_min)
    peak, peak_step = -math.inf, None
    ever = {tau: set() for tau in taus}
    head_steps = above_first = 0
    for x in m:
        grid = x.get("max_logit_per_head") or []
        for l, row in enumerate(grid):
            for h, v in enumerate(row):
                if not finite(v):
                    continue
                head_steps += 1
                above_first += v > taus[0]
                for tau in taus:
                    if v > tau:
                        ever[tau].add((l, h))
        if finite(x.get("max_logit")) and x["max_logit"] > peak:
            peak, peak_step = x["max_logit"], x["step"]
    heads = sum(len(r) for r in (m[0].get("max_logit_per_head") or []))
    tail = [v for v in losses[-41:] if finite(v)]
    return {
        "steps": m[-1]["step"],
        "final_val": vals[-1] if vals else None,
        "best_val": min(vals) if vals else None,
        "train_tail": statistics.median(tail) if tail else None,
        "rise": rise,
        "peak": peak if peak_step is not None else None,
        "peak_step": peak_step,
        "final_logit": m[-1].get("max_logit"),
        "ever": {tau: (len(ever[tau]) / heads if heads else None) for tau in taus},
        "head_steps_above": above_first / head_steps if head_steps else None,
        "spikes": sum(1 for e in ev if e.get("type") == "spike"),
        "aborted": next((e["step"] for e in ev if e.get("type") == "abort"), None),
        "non_finite": any(not finite(v) for v in losses),
        "tok_s": statistics.median([x["tokens_per_s"] for x in m if finite(x.get("tokens_per_s"))] or [0]),
    }


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--tau", type=float, action="append")
    args = p.parse_args()
    taus = args.tau or [100.0, 30.0]
    head = ["run", "steps", "val @ end", "best val", "train (median last 41)", "rise", "peak max logit (step)",
            "final max logit"] + [f"heads ever > {t:g}" for t in taus] + [f"head-steps > {taus[0]:g}", "spikes",
                                                                          "diverged"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in sorted(os.listdir(args.root)):
        run = os.path.join(args.root, name)
        if not os.path.isdir(run) or name == "report":
            continue
        s = summarize(run, taus)
        if s is None:
            continue
        diverged = "non-finite" if s["non_finite"] else (f"aborted @{s['aborted']}" if s["aborted"] else "no")
        cells = [name, str(s["steps"]), fmt(s["final_val"], ".3f"), fmt(s["best_val"], ".3f"),
                 fmt(s["train_tail"], ".3f"), fmt(s["rise"], ".2f"),
                 f"{fmt(s['peak'], '.4g')} ({s['peak_step']})", fmt(s["final_logit"], ".4g")]
        cells += [fmt(None if s["ever"][t] is None else 100 * s["ever"][t], ".0f") + "%" for t in taus]
        cells += [fmt(None if s["head_steps_above"] is None else 100 * s["head_steps_above"], ".1f") + "%",
                  str(s["spikes"]), diverged]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
