#!/bin/bash
# ftp-serve -m hf:ORG/REPO[:FILE] against fake_hub.py, a loopback server
# imitating the hub's file API with the TinyStories-656K files of
# ../shared/data: downloads, verifies and serves; a second run makes no
# request; offline uses the cache; a corrupted download is refused with
# the sha256 named; an interrupted download resumes with a Range request;
# HF_TOKEN is sent; a folder (config.json, safetensors, tokenizer) is
# fetched whole; a listing in pages is followed.
set -u
serve=$1
here=$(cd "$(dirname "$0")" && pwd)
data=${FTP_TEST_DATA:-}
m=$data/models/tinystories-656k
if [ ! -f "$m/TinyStories-656K.f16.gguf" ] || [ ! -d "$m/hf" ]; then
  echo "SKIP: tinystories-656k not found under '$data' (set FTP_TEST_DATA to ../shared/data)"
  exit 77
fi
source "$here/../tools/common.sh"
tmp=$(mktemp -d)
hub=
trap '[ -n "$hub" ] && kill "$hub" 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir -p "$tmp/gguf"
cp "$m/TinyStories-656K.f16.gguf" "$tmp/gguf/"
gguf=TinyStories-656K.f16.gguf
sha=$(sha256sum "$m/$gguf" | cut -d' ' -f1)

# start_hub ARGS...: (re)starts the fake hub; sets $hub, $HF_ENDPOINT; log $tmp/hub.log.
start_hub() {
  [ -n "$hub" ] && { kill "$hub"; wait "$hub" 2>/dev/null; }
  rm -f "$tmp/port" "$tmp/hub.log"; touch "$tmp/hub.log"
  /usr/bin/python3 "$here/fake_hub.py" --repo "test-org/TinyStories-656K-GGUF=$tmp/gguf" \
    --repo "test-org/TinyStories-656K=$m/hf" --log "$tmp/hub.log" --port-file "$tmp/port" "$@" &
  hub=$!
  for _ in $(seq 1 100); do [ -f "$tmp/port" ] && break; sleep 0.05; done
  export HF_ENDPOINT=http://127.0.0.1:$(cat "$tmp/port")
}
export XDG_CACHE_HOME=$tmp/cache
unset HF_TOKEN HF_HUB_OFFLINE
cached=$XDG_CACHE_HOME/flextp/hf/test-org/TinyStories-656K-GGUF/$gguf
ref=hf:test-org/TinyStories-656K-GGUF
"$serve" -m "$m/$gguf" -p 'Once upon a time' -n 30 >"$tmp/want"

# Download, verify, serve.
start_hub
"$serve" -m "$ref" -p 'Once upon a time' -n 30 >"$tmp/out" 2>"$tmp/err"
check "download: exit 0" test $? -eq 0
check "download: the file is the hub's, byte for byte" cmp "$cached" "$m/$gguf"
check "download: the completion equals the local file's" cmp "$tmp/out" "$tmp/want"
check "download: the listing was asked" grep -q '^GET /api/models/test-org/TinyStories-656K-GGUF/tree/main' "$tmp/hub.log"
check "download: the file came through the redirect" grep -q "^GET /cdn/test-org/TinyStories-656K-GGUF/$gguf range=-" "$tmp/hub.log"
check "download: the sha256 was checked and named" grep -q "sha256 $sha verified" "$tmp/err"
check "download: no part file left" test ! -e "$cached.part"

# A second run: no request at all.
: >"$tmp/hub.log"
"$serve" -m "$ref" -p 'Once upon a time' -n 30 >"$tmp/out" 2>"$tmp/err"
check "second run: exit 0, same completion" cmp "$tmp/out" "$tmp/want"
check "second run: no request" test ! -s "$tmp/hub.log"
check "second run: from the cache" grep -q 'from the cache' "$tmp/err"
# With the file named, and offline with the hub gone.
"$serve" -m "$ref:$gguf" -p 'Once upon a time' -n 30 >"$tmp/out" 2>/dev/null
check "hf:REPO:FILE from the cache: no request" test ! -s "$tmp/hub.log"
kill "$hub"; wait "$hub" 2>/dev/null; hub=
HF_HUB_OFFLINE=1 "$serve" -m "$ref" -p 'Once upon a time' -n 30 >"$tmp/out" 2>/dev/null
check "offline, hub down: served from the cache" cmp "$tmp/out" "$tmp/want"
"$serve" -m "$ref" -p 'Once upon a time' -n 30 >"$tmp/out" 2>/dev/null
check "hub down, cache complete: served" cmp "$tmp/out" "$tmp/want"
HF_HUB_OFFLINE=1 "$serve" -m hf:test-org/TinyStories-656K -p x -n 1 >/dev/null 2>"$tmp/err"; rc=$?
check "offline, not cached: exit 1" test $rc -eq 1
check "offline, not cached: says offline" grep -q 'offline (HF_HUB_OFFLINE)' "$tmp/err"

# A corrupted download: refused, the sha256 named, nothing kept.
rm -rf "$XDG_CACHE_HOME"
start_hub --corrupt "$gguf"
"$serve" -m "$ref" -p x -n 1 >/dev/null 2>"$tmp/err"; rc=$?
check "corrupt: exit 1" test $rc -eq 1
check "corrupt: names the sha256 listed" grep -q "sha256 mismatch: the hub lists $sha, the download has [0-9a-f]\{64\}" "$tmp/err"
check "corrupt: one error line" test "$(grep -c 'error' "$tmp/err")" -eq 1
check "corrupt: neither file nor part kept" test ! -e "$cached" -a ! -e "$cached.part"

# An interrupted download resumes where it stopped.
rm -rf "$XDG_CACHE_HOME"
start_hub --cut-after 500000
"$serve" -m "$ref" -p x -n 1 >/dev/null 2>"$tmp/err"; rc=$?
check "cut: the first run fails" test $rc -ne 0
check "cut: a part of 500000 bytes is left" test "$(stat -c %s "$cached.part" 2>/dev/null)" = 500000
"$serve" -m "$ref" -p 'Once upon a time' -n 30 >"$tmp/out" 2>"$tmp/err"
check "resume: exit 0, same completion" cmp "$tmp/out" "$tmp/want"
check "resume: asked for bytes=500000-" grep -q "^GET /cdn/test-org/TinyStories-656K-GGUF/$gguf range=bytes=500000-" "$tmp/hub.log"
check "resume: the file is whole" cmp "$cached" "$m/$gguf"

# HF_TOKEN: sent as a bearer token; without it, 401 is explained.
rm -rf "$XDG_CACHE_HOME"
start_hub --token hf_secret
"$serve" -m "$ref" -p x -n 1 >/dev/null 2>"$tmp/err"; rc=$?
check "no token: exit 1" test $rc -eq 1
check "no token: HTTP 401 and HF_TOKEN named" grep -q 'HTTP 401.*HF_TOKEN' "$tmp/err"
HF_TOKEN=hf_secret "$serve" -m "$ref" -p 'Once upon a time' -n 30 >"$tmp/out" 2>/dev/null
check "HF_TOKEN: served" cmp "$tmp/out" "$tmp/want"
check "HF_TOKEN: sent as Bearer" grep -q 'auth=Bearer hf_secret' "$tmp/hub.log"

# A Hugging Face folder in listing pages of two: every file, each checked
# (sha256 for safetensors, the git blob id for the JSON files).
rm -rf "$XDG_CACHE_HOME"
start_hub --page-size 2
"$serve" -m hf:test-org/TinyStories-656K -p x -n 1 >/dev/null 2>"$tmp/err"
dir=$XDG_CACHE_HOME/flextp/hf/test-org/TinyStories-656K
ok=1
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
  cmp -s "$dir/$f" "$m/hf/$f" || ok=0
done
check "folder: every file fetched, byte for byte" test $ok -eq 1
check "folder: three listing pages followed" test "$(grep -c '^GET /api/models/test-org/TinyStories-656K/tree' "$tmp/hub.log")" -eq 3
check "folder: git blob ids checked" grep -q 'config.json: git blob sha1 [0-9a-f]\{40\} verified' "$tmp/err"

# Bad references and missing files: one line, the value named.
"$serve" -m hf:no-slash -p x -n 1 >/dev/null 2>"$tmp/err"; rc=$?
check "hf:no-slash: exit 2, names the value" test $rc -eq 2 -a "$(grep -c "hf:no-slash" "$tmp/err")" -eq 1
"$serve" -m "$ref:nothing.gguf" -p x -n 1 >/dev/null 2>"$tmp/err"; rc=$?
check "no such FILE: exit 2, lists the GGUF files" test $rc -eq 2
check "no such FILE: lists the GGUF files" grep -q "its GGUF files: $gguf" "$tmp/err"
"$serve" -m hf:test-org/absent -p x -n 1 >/dev/null 2>"$tmp/err"; rc=$?
check "no such repo: exit 1, HTTP 404" test $rc -eq 1 -a "$(grep -c 'HTTP 404' "$tmp/err")" -eq 1
finish
