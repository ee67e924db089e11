#!/bin/bash
# ftp-probe end to end: real measurements on this machine, virtual devices,
# cluster specs from examples/, broken specs with path-precise errors.
set -u
probe=$1
src=$2
source "$(dirname "$0")/common.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$probe" --quick --json=short >"$tmp/local.json" 2>"$tmp/err"; rc=$?
check "probe exits 0" test $rc -eq 0
check "probe: one line in a pipe with --json=short" test "$(wc -l <"$tmp/local.json")" -eq 1
check "probe: kind and devices" jq -e '.kind=="ftp.topology/v1" and (.devices|length)>=1' "$tmp/local.json"
check "probe: every device measured, positive" \
  jq -e 'all(.devices[]; .memory_bandwidth_gb_s>0 and .gemm_tflop_s>0 and .memory_bytes>0 and .perf_source=="measured")' "$tmp/local.json"
check "probe: every device in an island" jq -e '([.islands[].devices[]]|sort) == ([.devices[].id]|sort)' "$tmp/local.json"
check "probe: node with cpu facts" jq -e '.nodes[0].cpu_cores>=1 and .nodes[0].memory_bytes>0' "$tmp/local.json"

"$probe" --virtual-devices 4 --quick --json=short >"$tmp/vd.json" 2>"$tmp/err"; rc=$?
check "virtual devices exit 0" test $rc -eq 0
check "4 virtual devices in one island" \
  jq -e '([.devices[]|select(.type=="virtual")]|length)==4 and (.islands|length)==1 and (.islands[0].devices|length)==4' "$tmp/vd.json"
check "island all-reduce bus bandwidth" \
  jq -e '.islands[0].allreduce.busbw_gb_s>0 and .islands[0].allreduce.via=="inproc" and .islands[0].allreduce.ranks==4' "$tmp/vd.json"
check "busbw = algbw x 2(n-1)/n" \
  jq -e '.islands[0].allreduce | ((.busbw_gb_s - .algbw_gb_s*2*3/4) | fabs) < 1e-9 * .busbw_gb_s' "$tmp/vd.json"
check "virtual device memory adds up" \
  jq -e '([.devices[].memory_bytes]|add) <= .nodes[0].memory_bytes' "$tmp/vd.json"

"$probe" --json=pretty --cluster "$src/examples/clusters/a100-8x-nvlink.json" >"$tmp/pretty.json"
check "--json=pretty is indented" test "$(wc -l <"$tmp/pretty.json")" -gt 10

for f in "$src"/examples/clusters/*.json; do
  "$probe" --cluster "$f" --json=short >"$tmp/c.json" 2>"$tmp/err"; rc=$?
  check "cluster $(basename "$f") validates" test $rc -eq 0
  check "cluster $(basename "$f") is a topology" jq -e '.kind=="ftp.topology/v1" and .source=="cluster-spec" and (.islands|length)>=1' "$tmp/c.json"
done
"$probe" --cluster "$src/examples/clusters/a100-8x-nvlink.json" --json=short >"$tmp/a100.json"
check "a100: 8 GPUs, one island, estimated busbw 300" \
  jq -e '(.devices|length)==8 and (.islands|length)==1 and .islands[0].allreduce.busbw_gb_s==300' "$tmp/a100.json"
"$probe" --cluster "$src/examples/clusters/flexpipe-fragmented.json" --json=short >"$tmp/fp.json"
check "flexpipe: MIG slices, A800 island apart from the L40S" \
  jq -e '([.devices[]|select(.type=="mig")]|length)==3 and ([.islands[]|select(.devices|index("m0.a8000"))][0].devices|length)==4' "$tmp/fp.json"
cat "$src/examples/clusters/two-nodes-4gpu-100g.json" | "$probe" --cluster - --json=short >"$tmp/two.json"
check "cluster spec from stdin" jq -e '(.islands|length)==2' "$tmp/two.json"

expect_error() {  # expect_error NAME EXPECTED_RC PATTERN ARGS...
  local name=$1 want=$2 pattern=$3; shift 3
  "$probe" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  check "$name: exit $want" test $rc -eq "$want"
  check "$name: message" grep -qF -- "$pattern" "$tmp/err"
  check "$name: nothing on stdout" test ! -s "$tmp/out"
}
b=$src/examples/broken
expect_error "missing field" 2 "ftp-probe: error: $b/cluster-missing-field.json: nodes[0].devices[0].memory_gib: missing required field" --cluster "$b/cluster-missing-field.json"
expect_error "negative memory" 2 "nodes[0].devices[0].memory_gib: must be positive, got -16" --cluster "$b/cluster-negative-memory.json"
expect_error "unknown link device" 2 "links[0].b: unknown device \"n0.gpu2\"" --cluster "$b/cluster-unknown-link.json"
echo '{"kind": "ftp.cluster/v1", "nodes": [' >"$tmp/trunc.json"
expect_error "malformed JSON" 2 "$tmp/trunc.json:2:1: malformed JSON" --cluster "$tmp/trunc.json"
expect_error "a directory" 2 "ftp-probe: error: $tmp: is a directory, not a file" --cluster "$tmp"
expect_error "--count without --watch" 2 "--count: only with --watch" --count 3 --cluster "$b/../clusters/a100-8x-nvlink.json"
expect_error "--count 0" 2 "--count: must be > 0, got 0" --watch --count 0
expect_error "wrong kind" 2 'kind: expected "ftp.cluster/v1", got "ftp.topology/v1"' --cluster "$tmp/a100.json"
expect_error "missing file" 2 "/nonexistent.json: cannot open" --cluster /nonexistent.json
expect_error "negative virtual devices" 2 "ftp-probe: error:" --virtual-devices -1

finish
