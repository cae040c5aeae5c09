#!/usr/bin/env python3
"""Prints the numbers the studies' READMEs quote, from a sweep's run folders (stdlib only).

    python3 experiments/summarize.py experiments/lr_width/runs

Per variant: steps done, final and best validation loss, the largest rise of the 10-step
median training loss above its running minimum after step 10 (the "unstable" criterion of
lr_width and norm_placement), peak grad norm, peak max attention logit, final update-to-weight
ratio, final activation RMS of the last block, median tokens/s, spike events and whether the
run aborted.
"""
import json
import math
import os
import statistics
import sys


def read_jsonl(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a torn last line of a killed run
    return out


def num(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def summarize(run):
    m = read_jsonl(os.path.join(run, "metrics.jsonl"))
    ev = read_jsonl(os.path.join(run, "events.jsonl"))
    if not m:
        return None
    losses = [num(x.get("loss")) for x in m]
    vals = [num(x["val_loss"]) for x in m if "val_loss" in x and num(x["val_loss"]) is not None]
    rise, running_min = 0.0, math.inf
    for i in range(len(losses)):
        window = [v for v in losses[max(0, i - 9):i + 1] if v is not None]
        if len(window) < 10 or i < 10:
            continue
        med = statistics.median(window)
        running_min = min(running_min, med)
        rise = max(rise, med - running_min)
    grads = [num(x.get("grad_norm")) for x in m if num(x.get("grad_norm")) is not None]
    logits = [num(x.get("max_logit")) for x in m if num(x.get("max_logit")) is not None]
    tps = [num(x.get("tokens_per_s")) for x in m if num(x.get("tokens_per_s")) is not None]
    last = m[-1]
    act = last.get("activation_rms") or []
    return {
        "steps": last["step"],
        "final_val": vals[-1] if vals else None,
        "best_val": min(vals) if vals else None,
        "rise": rise,
        "max_grad": max(grads) if grads else None,
        "max_logit": max(logits) if logits else None,
        "update_ratio": num(last.get("update_rms_ratio")),
        "act_rms_last": num(act[-1]) if act else None,
        "act_rms_first": num(act[0]) if act else None,
        "tok_s": statistics.median(tps) if tps else None,
        "spikes": sum(1 for e in ev if e.get("type") == "spike"),
        "aborted": next((e["step"] for e in ev if e.get("type") == "abort"), None),
    }


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    root = sys.argv[1]
    print("| run | steps | final val | best val | rise | max grad | max logit | upd ratio | act RMS first/last | tok/s | spikes | aborted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in sorted(os.listdir(root)):
        run = os.path.join(root, name)
        if not os.path.isdir(run):
            continue
        s = summarize(run)
        if s is None:
            continue
        print(f"| {name} | {s['steps']} | {fmt(s['final_val'], '.3f')} | {fmt(s['best_val'], '.3f')} | "
              f"{s['rise']:.2f} | {fmt(s['max_grad'], '.3g')} | {fmt(s['max_logit'], '.4g')} | "
              f"{fmt(s['update_ratio'], '.2e')} | {fmt(s['act_rms_first'], '.3g')}/{fmt(s['act_rms_last'], '.3g')} | "
              f"{fmt(s['tok_s'], '.0f')} | {s['spikes']} | {s['aborted'] if s['aborted'] else '-'} |")


if __name__ == "__main__":
    main()
