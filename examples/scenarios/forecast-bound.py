#!/usr/bin/env python3
"""What a causal load forecast can do for the goal of issue #18, from static runs.

Usage: forecast-bound.py [--delay-s D] GEARS.json OUT_DIR PREFIX...

Each PREFIX names one trace with, in OUT_DIR, the static runs of every gear
of GEARS.json (ftp.gear-table/v1, smallest first) replayed with interval
records one second apart: PREFIX.1s-static-GEAR.jsonl and .summary.json
(`ftp-plan simulate --policy static:GEAR --interval 1`). The first PREFIX is
the one the "chosen on" line picks each family's setting on.

As hindsight-bound.py does per 10 s, it takes per second the gear a policy
would hold and counts that gear's static run in that second: its requests
met and its devices. A policy here wants a gear from what it has seen up to
the end of a second, and that gear serves D seconds later (--delay-s, 5: the
observation 1 s apart, then the shift's reserve, warm-up and ramp, about
4 s on the engine model); shifts are otherwise free, and a gear's second
carries that gear's own queue, not the policy's. Every family keeps the
reactive floor (the gear a second needed, known at its end: the smallest
gear whose static run met the SLA there as the largest gear's did, minus a
point) and holds what it wants H seconds before a shift down. What the
forecasts see: the prompt tokens the largest gear prefilled each second,
which on that gear is within a second of their arrival.

  reactive      the floor alone, held H
  ewma          EWMA of prompt tokens/s (time constant tau s) against u x
                each gear's prefill capacity (its prefill_tokens_s)
  holt          Holt's level and trend (weights a, b), h s ahead, against u x capacity
  roc           rate of change: the mean of the last w s over r x the
                60 s EWMA before it, and over u x the second-largest gear's
                capacity, wants the largest gear
  backlog-lead  the fluid backlog the second-largest gear would build,
                L s ahead at its growth, over thr s of its prefill, wants
                the largest gear
  reserve       reserve-ahead from the bursts seen: after a burst (EWMA over
                u x the second-largest gear's capacity, 60 s after the
                last), the largest gear from q x the shortest (or median)
                gap between bursts so far, for R s
  foresight     NOT CAUSAL, a reference: the ewma rule on the prompt tokens
                of the next L s, known exactly

For each trace and family it prints the fewest GPU-hours at which some
setting reaches the SLA goal (the best static gear's attainment minus a
point), the best SLA attainment within 60 % of that gear's GPU-hours (each
the best over the family's grid on that trace, so an upper bound of the
family), and the goal met or not; then, per family, the setting chosen on
the first trace (the best SLA within 60 %) on every trace.
"""
import argparse
import itertools
import json
import math
import statistics
from collections import deque


def records(path):
    with open(path) as f:
        return {round(r["t_s"], 3): r for r in map(json.loads, f) if r.get("kind") == "ftp.sim-interval/v1"}


class Trace:
    """The static runs of one trace, one second apart."""

    def __init__(self, out, prefix, gears):
        self.prefix = prefix
        self.runs = [records(f"{out}/{prefix}.1s-static-{g}.jsonl") for g in gears]
        self.sums = [json.load(open(f"{out}/{prefix}.1s-static-{g}.summary.json")) for g in gears]
        self.devices = [r[min(r)]["devices"] for r in self.runs]
        self.times = sorted(self.runs[-1])
        top = len(gears) - 1
        self.need = []
        for t in self.times:
            ref = self.runs[top][t]["sla_attainment"]
            for k, run in enumerate(self.runs):
                x = run.get(t)
                if k == top or (x is not None and x["sla_attainment"] >= ref - 0.01):
                    break
            self.need.append(k)
        self.prompt = [self.runs[top][t]["prompt_tokens_s"] for t in self.times]
        self.best = min(range(len(gears)), key=lambda k: (-self.sums[k]["sla_attainment"], self.sums[k]["gpu_hours"]))
        self.goal_sla = self.sums[self.best]["sla_attainment"] - 0.01

    def account(self, gear):
        """SLA attainment and share of the best static gear's GPU-hours of gear[i] in each second."""
        met = served = device_s = 0.0
        for i, t in enumerate(self.times):
            top = self.runs[-1][t]
            n = top.get("finished", top["requests"])
            x = self.runs[gear[i]].get(t, top)
            met += x["sla_attainment"] * n
            served += n
            device_s += self.devices[gear[i]]
        return met / max(served, 1), 100 * device_s / 3600 / self.sums[self.best]["gpu_hours"]


def hold(g, h):
    """The highest of the last h values: a shift down only after h s."""
    out, q = [], deque()
    for i, x in enumerate(g):
        while q and q[-1][1] <= x:
            q.pop()
        q.append((i, x))
        while q[0][0] <= i - h:
            q.popleft()
        out.append(q[0][1])
    return out


def ewma(p, tau):
    a, level, out = 1 - math.exp(-1 / tau), 0.0, []
    for x in p:
        level += a * (x - level)
        out.append(level)
    return out


def holt(p, a, b, h):
    level, trend, out = p[0], 0.0, []
    for x in p:
        last = level
        level = a * x + (1 - a) * (level + trend)
        trend = b * (level - last) + (1 - b) * trend
        out.append(max(0.0, level + h * trend))
    return out


class Families:
    """Each family's grid: (family, setting, wanted gear per second)."""

    def __init__(self, caps):
        self.caps = caps
        self.top = len(caps) - 1

    def by_cap(self, x, u):
        return next((k for k, c in enumerate(self.caps) if x <= u * c), self.top)

    def on_floor(self, tr, series, u, h):
        return hold([max(self.by_cap(x, u), n) for x, n in zip(series, tr.need)], h)

    def trigger(self, tr, fire, h):
        return hold([self.top if f else n for f, n in zip(fire, tr.need)], h)

    def all(self, tr):
        p, second = tr.prompt, self.caps[-2]
        for h in (30, 60, 120, 300, 600):
            yield "reactive", f"H {h}", hold(tr.need, h)
        for tau in (2, 5, 10, 30):
            e = ewma(p, tau)
            for u, h in itertools.product((0.3, 0.5, 0.7, 0.9), (30, 60, 120, 300)):
                yield "ewma", f"tau {tau}, u {u}, H {h}", self.on_floor(tr, e, u, h)
        for a, b, ahead in itertools.product((0.3, 0.6), (0.1, 0.3), (5, 10)):
            f = holt(p, a, b, ahead)
            for u, h in itertools.product((0.5, 0.7, 0.9, 1.2), (30, 60, 120, 300)):
                yield "holt", f"a {a}, b {b}, h {ahead}, u {u}, H {h}", self.on_floor(tr, f, u, h)
        base = [0.0] + ewma(p, 60)[:-1]
        for w in (3, 5, 10):
            recent = [sum(p[max(0, i - w + 1):i + 1]) / w for i in range(len(p))]
            for r, u, h in itertools.product((2, 4, 8), (0.2, 0.4), (30, 60, 120, 300)):
                fire = [m > r * b and m > u * second for m, b in zip(recent, base)]
                yield "roc", f"w {w}, r {r}, u {u}, H {h}", self.trigger(tr, fire, h)
        for lead in (0, 2, 5, 10):
            backlog, last, ahead = 0.0, 0.0, []
            for x in p:
                backlog = max(0.0, backlog + x - second)
                ahead.append((backlog + max(0.0, backlog - last) * lead) / second)
                last = backlog
            for thr, h in itertools.product((0.25, 0.5, 1, 2), (30, 60, 120, 300)):
                yield "backlog-lead", f"L {lead}, thr {thr}, H {h}", self.trigger(tr, [b > thr for b in ahead], h)
        level = ewma(p, 3)
        for u, q, r, h, stat in itertools.product((0.7, 0.9), (0.3, 0.5, 0.7, 0.9), (30, 60, 120, 300),
                                                  (30, 60, 120, 300), ("min", "median")):
            fire, bursts, last = [], [], -1e9
            for i, x in enumerate(level):
                if x > u * second:
                    if i - last > 60:
                        bursts.append(i)
                    last = i
                on = False
                if len(bursts) >= 2:
                    gaps = [b - a for a, b in zip(bursts, bursts[1:])]
                    start = bursts[-1] + q * (min(gaps) if stat == "min" else statistics.median(gaps))
                    on = start <= i <= start + r
                fire.append(on)
            yield "reserve", f"u {u}, q {q}, R {r}, H {h}, {stat}", self.trigger(tr, fire, h)
        n = len(p)
        for lead in (3, 5, 10):
            future = [max(p[i:min(n, i + lead + 1)]) for i in range(n)]
            for tau, u, h in itertools.product((1, 2, 5), (0.5, 0.7, 0.9, 1.2), (10, 30, 60, 120, 300)):
                yield f"foresight {lead} s", f"tau {tau}, u {u}, H {h}", self.on_floor(tr, ewma(future, tau), u, h)


def delayed(g, d, start):
    """The gear wanted at i - d serves at i; before that the start gear."""
    return [g[i - d] if i >= d else start for i in range(len(g))]


def fmt(r):
    return f"{r[0]:.3f} at {r[1]:.0f} %" if r else "none"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delay-s", type=int, default=5)
    ap.add_argument("gears")
    ap.add_argument("out")
    ap.add_argument("prefixes", nargs="+")
    a = ap.parse_args()
    table = json.load(open(a.gears))
    names = [g["name"] for g in table["gears"]]
    caps = [((g.get("measured") or {}).get("prefill_tokens_s") or g["estimated"]["prefill_tokens_s"]) for g in table["gears"]]
    fam = Families(caps)
    start = names.index("tp4") if "tp4" in names else 0  # the policies of (c) start on tp4
    results = {}  # (family, setting) -> {prefix: (sla, share)}
    traces = [Trace(a.out, p, names) for p in a.prefixes]
    for tr in traces:
        for f, s, g in fam.all(tr):
            results.setdefault((f, s), {})[tr.prefix] = tr.account(delayed(g, a.delay_s, start))
    families = list(dict.fromkeys(f for f, _ in results))
    print(f"Forecasts against the goal, per second, the gear serving {a.delay_s} s after the second it was chosen on;")
    print("best setting of each family on each trace (SLA attainment at its share of the best static gear's GPU-hours):")
    print()
    print("| trace | SLA goal | family | fewest GPU-hours at the SLA goal | best SLA within 60 % | goal met |")
    print("|---|---|---|---|---|---|")
    for tr in traces:
        for f in families:
            rows = [(s, v[tr.prefix]) for (ff, s), v in results.items() if ff == f]
            ok = [r for _, r in rows if r[0] >= tr.goal_sla]
            cheap = [r for _, r in rows if r[1] <= 60]
            met = any(r[1] <= 60 for r in ok)
            print(f"| {tr.prefix} | {tr.goal_sla:.3f} | {f} | {fmt(min(ok, key=lambda r: r[1]) if ok else None)} | "
                  f"{fmt(max(cheap, key=lambda r: r[0]) if cheap else None)} | {'yes' if met else 'no'} |")
    print()
    first = traces[0].prefix
    print(f"Each family's setting chosen on {first} (the best SLA within 60 % there), on every trace:")
    print()
    print("| family | setting | " + " | ".join(tr.prefix for tr in traces) + " |")
    print("|---|---|" + "---|" * len(traces))
    for f in families:
        rows = [(s, v) for (ff, s), v in results.items() if ff == f and v[first][1] <= 60]
        if not rows:
            continue
        s, v = max(rows, key=lambda r: r[1][first][0])
        print(f"| {f} | {s} | " + " | ".join(fmt(v[tr.prefix]) for tr in traces) + " |")


if __name__ == "__main__":
    main()
