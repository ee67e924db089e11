#!/usr/bin/python3
# A loopback server that imitates the Hugging Face hub's file API for the
# hub tests (Debian's python3, stdlib only):
#   GET /api/models/ORG/REPO/tree/main?recursive=true   the file listing,
#       LFS files (.gguf, .safetensors, .bin) with lfs.oid = sha256, the
#       others with oid = their git blob id, both computed here by hashlib;
#       --page-size N splits it into pages chained by Link: rel="next"
#   GET /ORG/REPO/resolve/main/PATH   the file; LFS files answer 302 to
#       /cdn/ORG/REPO/PATH as the hub sends them to its file store
#   Range: bytes=N- is answered 206.
# Every request is appended to --log ("GET PATH range=... auth=...").
# Faults: --corrupt PATH serves PATH with one byte flipped (the listing
# keeps the true sha256); --cut-after N sends the headers of the first
# whole-file GET with the full length and then only N bytes and closes;
# --token T answers 401 to a request without "Authorization: Bearer T".
import argparse
import hashlib
import http.server
import json
import os
import sys
import threading
import urllib.parse

ap = argparse.ArgumentParser()
ap.add_argument("--repo", action="append", default=[], help="ORG/REPO=DIR")
ap.add_argument("--log", required=True)
ap.add_argument("--port-file", required=True)
ap.add_argument("--corrupt", default="")
ap.add_argument("--cut-after", type=int, default=-1)
ap.add_argument("--token", default="")
ap.add_argument("--page-size", type=int, default=0)
args = ap.parse_args()

repos = {}
for spec in args.repo:
    name, d = spec.split("=", 1)
    files = {}
    for root, _, names in os.walk(d):
        for n in sorted(names):
            full = os.path.join(root, n)
            rel = os.path.relpath(full, d).replace(os.sep, "/")
            files[rel] = full
    repos[name] = files

LFS = (".gguf", ".safetensors", ".bin")


def entry(rel, full):
    data = open(full, "rb").read()
    e = {"type": "file", "path": rel, "size": len(data)}
    if rel.endswith(LFS):
        sha = hashlib.sha256(data).hexdigest()
        pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (sha.encode(), len(data))
        e["oid"] = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()  # the pointer's, as the hub lists
        e["lfs"] = {"oid": sha, "size": len(data), "pointerSize": len(pointer)}
    else:
        e["oid"] = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return e


lock = threading.Lock()
cut_done = [False]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *a):
        pass

    def record(self):
        with lock, open(args.log, "a") as f:
            f.write("%s %s range=%s auth=%s\n" % (self.command, self.path, self.headers.get("Range", "-"),
                                                 self.headers.get("Authorization", "-")))

    def send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.record()
        if args.token and self.headers.get("Authorization") != "Bearer " + args.token:
            return self.send(401, b'{"error":"Invalid credentials"}')
        url = urllib.parse.urlsplit(self.path)
        parts = urllib.parse.unquote(url.path).split("/")
        # /api/models/ORG/REPO/tree/main
        if len(parts) >= 7 and parts[1:3] == ["api", "models"] and parts[5:7] == ["tree", "main"]:
            files = repos.get(parts[3] + "/" + parts[4])
            if files is None:
                return self.send(404, b'{"error":"Repository not found"}')
            listing = [entry(r, f) for r, f in sorted(files.items())]
            q = urllib.parse.parse_qs(url.query)
            headers = [("Content-Type", "application/json")]
            if args.page_size > 0:
                start = int(q.get("cursor", ["0"])[0])
                page = listing[start:start + args.page_size]
                if start + args.page_size < len(listing):
                    nxt = "http://%s%s?recursive=true&cursor=%d" % (self.headers["Host"], url.path, start + args.page_size)
                    headers.append(("Link", '<%s>; rel="next"' % nxt))
                listing = page
            return self.send(200, json.dumps(listing).encode(), headers)
        # /ORG/REPO/resolve/main/PATH and /cdn/ORG/REPO/PATH
        if len(parts) >= 6 and parts[3:5] == ["resolve", "main"]:
            repo, rel, cdn = parts[1] + "/" + parts[2], "/".join(parts[5:]), False
        elif len(parts) >= 5 and parts[1] == "cdn":
            repo, rel, cdn = parts[2] + "/" + parts[3], "/".join(parts[4:]), True
        else:
            return self.send(404, b"no such route")
        full = repos.get(repo, {}).get(rel)
        if full is None:
            return self.send(404, b"Entry not found")
        if rel.endswith(LFS) and not cdn:
            return self.send(302, b"", [("Location", "/cdn/%s/%s" % (repo, urllib.parse.quote(rel)))])
        data = bytearray(open(full, "rb").read())
        if rel == args.corrupt:
            data[len(data) // 2] ^= 0xFF
        rng = self.headers.get("Range")
        start = 0
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            if start >= len(data):
                return self.send(416, b"", [("Content-Range", "bytes */%d" % len(data))])
        with lock:
            cut = args.cut_after >= 0 and not cut_done[0] and start == 0
            if cut:
                cut_done[0] = True
        if start > 0:
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Accept-Ranges", "bytes")
        if cut:
            self.send_header("Connection", "close")
        self.end_headers()
        if cut:
            self.wfile.write(bytes(data[:args.cut_after]))
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(bytes(data[start:]))


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(args.port_file + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(args.port_file + ".tmp", args.port_file)
try:
    srv.serve_forever()
except KeyboardInterrupt:
    sys.exit(0)
