#!/usr/bin/env python3
"""Hostile and load HTTP clients for tests/tools/hostile-http.sh and
tests/bench/http-load.sh (issue 20). Standard library only.

  slow PORT N SECONDS        N connections that send a header byte per second (slowloris)
  sse PORT N SECONDS         N streamed completions that are opened, then never read
  timed PORT K               K normal completions one after another: latencies in ms, one a line
  headers PORT MB            MB of headers on one request: the status, the bytes sent
  body PORT MB               a POST saying Content-Length MB MiB, no body sent: the status
  pipelined PORT             3 requests in one write: the number of answers
  keep PORT N SECONDS        N kept-alive connections that asked GET / once, then idle
  get PORT TIMEOUT           one GET /: its latency in ms, or "timeout"
  stall PORT                 half a request's headers, then nothing: the status and the ms until it came
  idle PORT                  one kept-alive GET /health, then nothing: ms from the answer to the close, bytes after it
  silent PORT                a connection that sends nothing: ms until the close, bytes received
"""
import selectors
import socket
import sys
import time


def connect(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def status_of(s, timeout=30):
    s.settimeout(timeout)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    return int(line.split()[1]) if line.startswith("HTTP/") else 0


def hold(port, n, seconds, first, each):
    conns = []
    for _ in range(n):
        try:
            s = connect(port)
            s.sendall(first)
            s.setblocking(False)
            conns.append(s)
        except OSError:
            pass
    print(f"open {len(conns)}", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(1)
        if each:
            for s in conns:
                try:
                    s.send(each)
                except OSError:
                    pass
    alive = 0
    for s in conns:
        try:
            if s.recv(4096) == b"":
                continue
        except BlockingIOError:
            alive += 1  # nothing from the server: still held
        except OSError:
            pass
    print(f"alive {alive}", flush=True)


def completion(max_tokens, stream):
    body = ('{"prompt":"Zoo","max_tokens":%d,"temperature":0%s}' % (max_tokens, ',"stream":true' if stream else ""))
    return ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode()


def timed(port, k):
    for _ in range(k):
        t0 = time.perf_counter()
        s = connect(port)
        s.sendall(completion(4, False).replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"))
        st = status_of(s)
        s.settimeout(30)
        while s.recv(65536):
            pass
        s.close()
        print("%.3f %d" % ((time.perf_counter() - t0) * 1000, st), flush=True)


def headers(port, mb):
    s = connect(port)
    sent = 0
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        line = b"X-Pad: " + b"a" * 1000 + b"\r\n"
        while sent < mb << 20:
            s.sendall(line * 64)
            sent += len(line) * 64
    except OSError:
        pass
    print(status_of(s), sent)


def body(port, mb):
    s = connect(port)
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n" % (mb << 20)).encode())
    print(status_of(s))


def pipelined(port):
    s = connect(port)
    three = completion(2, False) + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + completion(2, False).replace(
        b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
    s.sendall(three)
    s.settimeout(30)
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    print(data.count(b"HTTP/1.1 200 OK"))


def keep(port, n, seconds):
    """Opens n connections, asks GET / on each, and keeps them; prints how
    many were answered within 10 s."""
    conns = []
    for _ in range(n):
        try:
            s = connect(port)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            s.setblocking(False)
            conns.append(s)
        except OSError:
            pass
    sel = selectors.DefaultSelector()
    for s in conns:
        sel.register(s, selectors.EVENT_READ)
    answered, end = 0, time.time() + 10
    while answered < len(conns) and time.time() < end:
        for key, _ in sel.select(timeout=0.5):
            try:
                key.fileobj.recv(4096)
            except OSError:
                pass
            sel.unregister(key.fileobj)
            answered += 1
    print(f"open {len(conns)} answered {answered}", flush=True)
    time.sleep(seconds)


def get(port, timeout):
    t0 = time.perf_counter()
    try:
        s = connect(port)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        st = status_of(s, timeout)
    except OSError:
        st = 0
    ms = (time.perf_counter() - t0) * 1000
    print("%.1f" % ms if st == 200 else "timeout", flush=True)


def stall(port):
    s = connect(port)
    t0 = time.perf_counter()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    st = status_of(s, 60)
    print(st, "%.0f" % ((time.perf_counter() - t0) * 1000))


def until_closed(s, t0, timeout=60):
    """Reads until the server closes: (ms since t0, bytes read)."""
    s.settimeout(timeout)
    got = 0
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += len(chunk)
    except OSError:
        pass
    return (time.perf_counter() - t0) * 1000, got


def idle(port):
    s = connect(port)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    length = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0])
    while len(rest) < length:
        rest += s.recv(65536)
    t0 = time.perf_counter()
    ms, got = until_closed(s, t0)
    print("%.0f %d" % (ms, got + len(rest) - length))


def silent(port):
    s = connect(port)
    ms, got = until_closed(s, time.perf_counter())
    print("%.0f %d" % (ms, got))


def main():
    cmd, port = sys.argv[1], int(sys.argv[2])
    if cmd == "slow":
        hold(port, int(sys.argv[3]), float(sys.argv[4]), b"POST /v1/completions HTTP/1.1\r\n", b"X")
    elif cmd == "sse":
        hold(port, int(sys.argv[3]), float(sys.argv[4]), completion(2000, True), b"")
    elif cmd == "timed":
        timed(port, int(sys.argv[3]))
    elif cmd == "headers":
        headers(port, int(sys.argv[3]))
    elif cmd == "body":
        body(port, int(sys.argv[3]))
    elif cmd == "keep":
        keep(port, int(sys.argv[3]), float(sys.argv[4]))
    elif cmd == "get":
        get(port, float(sys.argv[3]))
    elif cmd == "stall":
        stall(port)
    elif cmd == "idle":
        idle(port)
    elif cmd == "silent":
        silent(port)
    elif cmd == "pipelined":
        pipelined(port)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
