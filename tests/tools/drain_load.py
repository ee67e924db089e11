#!/usr/bin/env python3
"""A drain under full load (issue 20, hostile input): for tests/tools/drain-load.sh.
Standard library only.

  drain_load.py PORT LOG DOMAIN CLIENTS MAX_TOKENS SOCKET

CLIENTS closed-loop clients stream greedy completions of MAX_TOKENS tokens
(ignore_eos) with their own x-request-id, stamping every token. After a
steady window the script asks the daemon's control socket SOCKET to drain
DOMAIN (method "drain", as ftp-drain --domain does) and times the call from
its request to its result, on a connection opened before: the drain itself,
not a tool's start-up (loading ftp-drain's libraries from a cold page cache
took 0.7 s in CI). Then the load stops and every request is awaited.

The requests that DOMAIN finished (its "event=finished" lines in the
daemon's LOG) and that had begun streaming before the drain started are the
ones the drain had to wait for. Each one's remaining time is estimated
independently of the drain: its tokens still to come at the drain's start
x the domain's median time between tokens in the window before it. The
longest of these is what the drain is compared with.

Prints one JSON object.
"""
import http.client
import json
import re
import socket
import statistics
import sys
import threading
import time


def stream(port, rid, max_tokens):
    """One streamed completion: its status, token times, text, and whether it ended well."""
    rec = {"id": rid, "status": 0, "times": [], "text": "", "done": False, "error": None}
    body = json.dumps({"prompt": "Zoo", "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/completions", body,
                  {"Content-Type": "application/json", "x-request-id": rid})
        r = c.getresponse()
        rec["status"] = r.status
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                rec["done"] = True
                break
            ev = json.loads(data)
            if "error" in ev:
                rec["error"] = ev["error"]
                continue
            ch = ev.get("choices") or []
            if ch and ch[0].get("text"):
                rec["times"].append(time.monotonic())
                rec["text"] += ch[0]["text"]
        c.close()
    except Exception as e:  # a failure counts; it is reported, never hidden
        rec["error"] = repr(e)
    return rec


def drain(sock, domain):
    """The drain call's final answer (the result or the error), after its progress notifications."""
    sock.sendall((json.dumps({"jsonrpc": "2.0", "id": 1, "method": "drain", "params": {"domain": domain}}) + "\n").encode())
    buf = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return {"error": "the control socket closed"}
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            msg = json.loads(line)
            if msg.get("id") == 1:
                return msg


def main():
    port, log, domain, clients, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.connect(sys.argv[6])
    records, lock, stop = [], threading.Lock(), threading.Event()

    def client_stamped(c):
        i = 0
        while not stop.is_set():
            i += 1
            rid = "load-%d-%d" % (c, i)
            rec = stream(port, rid, max_tokens)
            rec["end"] = time.monotonic()
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=client_stamped, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    time.sleep(4.0)  # past the first wave: every domain full, a queue waiting
    t0 = time.monotonic()
    answer = drain(control, domain)
    t1 = time.monotonic()
    control.close()
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()

    finished_on = {}
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.search(r"request_id=(load-\d+-\d+) domain_id=(\S+) event=finished", line)
            if m:
                finished_on[m.group(1)] = m.group(2)
    # The domain's pace before the drain: the mean time between tokens of
    # each of its requests that streamed wholly in the window before it
    # (a whole request's mean, so that tokens read in bursts do not count
    # as instant), and the median of those.
    paces = []
    for r in records:
        if finished_on.get(r["id"]) != domain or len(r["times"]) < 2:
            continue
        if t0 - 3.0 <= r["times"][0] and r["times"][-1] < t0:
            paces.append((r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1))
    tpot = statistics.median(paces) if paces else None
    waited = []
    for r in records:
        if finished_on.get(r["id"]) != domain or not r["times"]:
            continue
        if r["times"][0] < t0 and r["end"] > t0:
            left = max_tokens - sum(1 for t in r["times"] if t < t0)
            waited.append({"id": r["id"], "tokens_left": left,
                           "finished_after_ms": round((r["times"][-1] - t0) * 1000, 1)})
    longest_left = max((w["tokens_left"] for w in waited), default=0)
    longest_ms = longest_left * tpot * 1000 if tpot else None
    drain_ms = (t1 - t0) * 1000
    failed = [r for r in records if r["status"] != 200 or not r["done"] or r["error"]]
    texts = {r["text"] for r in records if r not in failed}
    print(json.dumps({
        "drain_result": answer.get("result"), "drain_error": answer.get("error"),
        "drain_ms": round(drain_ms, 1), "tpot_ms": round(tpot * 1000, 3) if tpot else None,
        "in_flight_at_drain": len(waited), "longest_tokens_left": longest_left,
        "longest_remaining_ms": round(longest_ms, 1) if longest_ms else None,
        "ratio": round(drain_ms / longest_ms, 3) if longest_ms else None,
        "paces": len(paces), "waited": waited,
        "requests": len(records), "failed": len(failed), "distinct_texts": len(texts),
        "failures": [{"id": r["id"], "status": r["status"], "error": r["error"]} for r in failed[:5]],
        "text": next(iter(texts)) if len(texts) == 1 else None,
    }))


if __name__ == "__main__":
    main()
