#!/usr/bin/env python3
"""Hindsight bound of a trace in examples/scenarios (c), from its static runs.

Usage: [HOLD=N] hindsight-bound.py OUT_DIR PREFIX GEAR... (gears smallest first, each
with a PREFIX-static-GEAR.jsonl and .summary.json in OUT_DIR).

For every 10 s interval it takes the smallest gear whose static run met the
SLA there for at least the largest gear's share minus a point, and adds up
that gear's devices and requests met. This is what a policy that knew the
future and shifted for free could reach, as far as the static runs tell
it; it is not a strict bound, since a gear's interval in its static run
carries that gear's own queue, not the one a policy would leave it. It
says whether the goal (60 % of the best static gear's GPU-hours) is out of
reach because of the trace itself.

The second line is the same choice made by a reactive policy: the gear an
interval needed is known only one interval (10 s) later and then held for
HOLD intervals (default 30, the gear shifter's 5 min down-peak window),
shifts still free. It says how much of the bound a policy that cannot see
the future, only react to it, can keep.
"""
import json
import os
import sys


def intervals(path):
    with open(path) as f:
        return {round(r["t_s"], 3): r for r in map(json.loads, f) if r.get("kind") == "ftp.sim-interval/v1"}


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: hindsight-bound.py OUT_DIR PREFIX GEAR...")
    out, prefix, gears = sys.argv[1], sys.argv[2], sys.argv[3:]
    hold = int(os.environ.get("HOLD", "30"))
    runs = []
    for g in gears:
        s = json.load(open(f"{out}/{prefix}-static-{g}.summary.json"))
        runs.append((g, s, intervals(f"{out}/{prefix}-static-{g}.jsonl")))
    largest = runs[-1]
    times = sorted(largest[2])
    # need[i]: index into runs of the smallest gear that met interval i as the largest did (minus a point).
    need = []
    for t in times:
        top = largest[2][t]
        for k, (g, s, iv) in enumerate(runs):
            x = iv.get(t)
            if x is not None and (x["sla_attainment"] >= top["sla_attainment"] - 0.01 or k == len(runs) - 1):
                break
        need.append(k)

    def account(choice):
        met = served = device_s = 0.0
        for i, t in enumerate(times):
            top = largest[2][t]
            n = top.get("finished", top["requests"])
            x = runs[choice(i)][2].get(t, top)
            met += x["sla_attainment"] * n
            served += n
            device_s += x["devices"] * 10
        return met / max(served, 1), device_s / 3600

    best = sorted((r for r in runs), key=lambda r: (-r[1]["sla_attainment"], r[1]["gpu_hours"]))[0]
    sla, gh = account(lambda i: need[i])
    print(f"hindsight bound (smallest static gear per 10 s interval, future known, shifts free): "
          f"SLA {sla:.3f} at {gh:.4g} GPU-hours = {100 * gh / best[1]['gpu_hours']:.0f} % "
          f"of the best static gear {best[0]}'s")
    sla, gh = account(lambda i: max(need[max(0, i - 1 - hold):i] or [0]))
    print()  # a paragraph of its own in Markdown
    print(f"reactive bound (the same gear known one interval late, held {hold * 10} s, shifts free): "
          f"SLA {sla:.3f} at {gh:.4g} GPU-hours = {100 * gh / best[1]['gpu_hours']:.0f} %")


if __name__ == "__main__":
    main()
