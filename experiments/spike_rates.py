#!/usr/bin/env python3
"""False-alarm and detection rates of the spike guard over finished runs (docs/training.md,
"How often it fires"). Replays every run's metrics.jsonl with `keel spikes` twice, with the
default gradient-norm rule (with_loss) and with the old one (alone), and injects a loss jump of
each FACTOR at every step in turn. Prints a Markdown table per study and the totals.

  python3 experiments/spike_rates.py [--keel build/release/keel] [--factor 2 --factor 1.1] RUN_DIR...
"""
import argparse
import collections
import json
import os
import subprocess


def replay(keel, run, extra):
    out = subprocess.run([keel, "spikes", run, "--json", *extra], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default="build/release/keel")
    ap.add_argument("--factor", type=float, action="append", help="loss-jump factors (default 2)")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    factors = a.factor or [2.0]
    rows = collections.OrderedDict()
    for run in a.runs:
        if not os.path.exists(os.path.join(run, "metrics.jsonl")):
            continue
        parent = os.path.dirname(os.path.normpath(run))
        # experiments/<study>/runs/<variant> or runs/<study>/<variant>
        study = os.path.basename(os.path.dirname(parent)) if os.path.basename(parent) == "runs" else os.path.basename(parent)
        new = replay(a.keel, run, [])
        old = replay(a.keel, run, ["--set", "spikes.grad_norm=alone"])
        jumps = [replay(a.keel, run, ["--loss-jump", str(f)])["loss_jump"] for f in factors]
        rows.setdefault(study, []).append((os.path.basename(os.path.normpath(run)), new, old, jumps))
    head = "| study | run | steps | spikes (grad_norm with_loss) | spikes (grad_norm alone) | " + \
           " | ".join(f"loss x{f:g} caught" for f in factors) + " |"
    print(head)
    print("|" + "---|" * (5 + len(factors)))
    tot = collections.Counter()
    caught = collections.Counter()
    for study, runs in rows.items():
        for name, new, old, jumps in runs:
            tot["steps"] += new["steps"]
            tot["new"] += len(new["spikes"])
            tot["old"] += len(old["spikes"])
            for f, j in zip(factors, jumps):
                tot[("trials", f)] += j["trials"]
                caught[f] += round(j["caught"] * j["trials"])
            cells = " | ".join(f"{100 * j['caught']:.1f}% of {j['trials']}" for j in jumps)
            print(f"| {study} | {name} | {new['steps']} | {len(new['spikes'])} | {len(old['spikes'])} | {cells} |")
    cells = " | ".join(f"{100 * caught[f] / max(1, tot[('trials', f)]):.2f}% of {tot[('trials', f)]}" for f in factors)
    print(f"| **all** | {sum(len(r) for r in rows.values())} runs | {tot['steps']} | {tot['new']} | {tot['old']} | {cells} |")


if __name__ == "__main__":
    main()
