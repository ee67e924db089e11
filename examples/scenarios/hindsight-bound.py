#!/usr/bin/env python3
"""Hindsight bound of a trace in examples/scenarios (c), from its static runs.

Usage: hindsight-bound.py OUT_DIR PREFIX GEAR... (gears smallest first, each
with a PREFIX-static-GEAR.jsonl and .summary.json in OUT_DIR).

For every 10 s interval it takes the smallest gear whose static run met the
SLA there for at least the largest gear's share minus a point, and adds up
that gear's devices and requests met. This is what a policy that knew the
future and shifted for free could reach, as far as the static runs tell
it; it is not a strict bound, since a gear's interval in its static run
carries that gear's own queue, not the one a policy would leave it. It
says whether the goal (60 % of the best static gear's GPU-hours) is out of
reach because of the trace itself.
"""
import json
import sys


def intervals(path):
    with open(path) as f:
        return {round(r["t_s"], 3): r for r in map(json.loads, f) if r.get("kind") == "ftp.sim-interval/v1"}


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: hindsight-bound.py OUT_DIR PREFIX GEAR...")
    out, prefix, gears = sys.argv[1], sys.argv[2], sys.argv[3:]
    runs = []
    for g in gears:
        s = json.load(open(f"{out}/{prefix}-static-{g}.summary.json"))
        runs.append((g, s, intervals(f"{out}/{prefix}-static-{g}.jsonl")))
    largest = runs[-1]
    met = served = device_s = 0.0
    for t, top in sorted(largest[2].items()):
        n = top.get("finished", top["requests"])
        for g, s, iv in runs:
            x = iv.get(t)
            if x is not None and (x["sla_attainment"] >= top["sla_attainment"] - 0.01 or g == largest[0]):
                break
        met += x["sla_attainment"] * n
        served += n
        device_s += x["devices"] * 10
    best = sorted((r for r in runs), key=lambda r: (-r[1]["sla_attainment"], r[1]["gpu_hours"]))[0]
    gh = device_s / 3600
    print(f"hindsight bound (smallest static gear per 10 s interval, future known, shifts free): "
          f"SLA {met / max(served, 1):.3f} at {gh:.4g} GPU-hours = {100 * gh / best[1]['gpu_hours']:.0f} % "
          f"of the best static gear {best[0]}'s")


if __name__ == "__main__":
    main()
