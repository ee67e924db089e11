#!/usr/bin/env python3
"""Hostile and load HTTP clients for tests/tools/hostile-http.sh and
tests/bench/http-load.sh (issue 20). Standard library only.

  slow PORT N SECONDS        N connections that send a header byte per second (slowloris)
  sse PORT N SECONDS         N streamed completions that are opened, then never read
  timed PORT K               K normal completions one after another: latencies in ms, one a line
  headers PORT MB            MB of headers on one request: the status, the bytes sent
  body PORT MB               a POST saying Content-Length MB MiB, no body sent: the status
  pipelined PORT             3 requests in one write: the number of answers
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


def main():
    cmd, port = sys.argv[1], int(sys.argv[2])
    if cmd == "slow":
        hold(port, int(sys.argv[3]), float(sys.argv[4]), b"POST /v1/completions HTTP/1.1\r\n", b"X")
    elif cmd == "sse":
        hold(port, int(sys.argv[3]), float(sys.argv[4]), completion(100000, True), b"")
    elif cmd == "timed":
        timed(port, int(sys.argv[3]))
    elif cmd == "headers":
        headers(port, int(sys.argv[3]))
    elif cmd == "body":
        body(port, int(sys.argv[3]))
    elif cmd == "pipelined":
        pipelined(port)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
