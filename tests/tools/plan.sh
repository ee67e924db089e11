#!/bin/bash
# ftp-plan end to end: every example cluster (through ftp-probe --cluster)
# with every example model: only feasible gears (checked against --explain and
# the weights each device holds), the fragmented cluster's stage split giving
# slower cards fewer layers, and models that fit nowhere naming the device and
# the bytes short; then bad inputs with their exit codes and messages.
set -u
probe=$1
plan=$2
src=$3
source "$(dirname "$0")/common.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
models=$src/examples/models

for c in "$src"/examples/clusters/*.json; do
  cn=$(basename "$c" .json)
  "$probe" --cluster "$c" --json=short >"$tmp/$cn.topo.json"
  for m in llama-7b llama-70b stories260K; do
    out=$tmp/$cn.$m.json
    "$plan" --topology "$tmp/$cn.topo.json" --model "$models/$m.json" >"$out" 2>"$tmp/err"; rc=$?
    # A cluster whose whole memory is below the model's weights (llama-70b in BF16 on one
    # 40 GB A100) has no gear: refused with exit 1, a device and the bytes short named.
    bpp=$(jq -r '{"f32":4,"f16":2,"bf16":2}[.dtype] // 1' "$models/$m.json")
    if jq -e --slurpfile m "$models/$m.json" --argjson bpp "$bpp" '$m[0] as $s
        | ($s.hidden_size * $s.n_kv_heads / $s.n_heads) as $kv
        | ($s.n_layers * $s.hidden_size * (2*$s.hidden_size + 2*$kv + 3*$s.intermediate_size)
           + 2*$s.vocab_size*$s.hidden_size) as $params
        | ([.devices[].memory_bytes]|add) < $params*$bpp' "$tmp/$cn.topo.json" >/dev/null; then
      check "$cn $m: more weights than memory: exit 1" test $rc -eq 1
      check "$cn $m: more weights than memory: names a device and bytes short" \
        grep -qE "no gear fits: $m needs .*GB short on device" "$tmp/err"
      check "$cn $m: more weights than memory: nothing on stdout" test ! -s "$out"
      continue
    fi
    check "$cn $m: exit 0" test $rc -eq 0
    check "$cn $m: a gear table for the model" \
      jq -e --arg m "$m" --arg t "$cn" '.kind=="ftp.gear-table/v1" and .model.name==$m and .topology==$t and (.gears|length)>=1' "$out"
    check "$cn $m: estimates, safe = 0.8 x max" \
      jq -e 'all(.gears[]; .estimated.source=="estimate" and .estimated.max_rps>0 and ((.estimated.safe_rps - 0.8*.estimated.max_rps)|fabs) < 1e-9*.estimated.max_rps)' "$out"
    check "$cn $m: normal gears ordered by capacity and devices" \
      jq -e '[.gears[]|select(.role=="normal")] | [range(1;length) as $i | .[$i-1].estimated.max_rps < .[$i].estimated.max_rps and ([.[$i-1].replicas[].stages[].devices[]]|length) <= ([.[$i].replicas[].stages[].devices[]]|length)] | all' "$out"
    check "$cn $m: every replica covers all layers" \
      jq -e '.model.n_layers as $n | all(.gears[].replicas[]; .stages[-1].layers[1]==$n and .stages[0].layers[0]==0)' "$out"
    check "$cn $m: names known, at most one memory guard" \
      jq -e 'all(.gears[]; .name|IN("economy","standard","performance","memory-guard")) and ([.gears[]|select(.role=="memory-guard")]|length)<=1' "$out"
    check "$cn $m: nothing on stderr in a pipe" test ! -s "$tmp/err"
    # Only feasible gears: each is a candidate that --explain calls feasible, with its devices
    # (ranks may be reordered so that shards nest) once each, in the topology, heads divisible
    # by tp, and every device's share of the weights (parameters x bytes x its stage's share of
    # the layers / tp) below its memory.
    "$plan" --topology "$tmp/$cn.topo.json" --model "$models/$m.json" --explain --json=short >/dev/null 2>"$tmp/explain"
    check "$cn $m: only gears that --explain calls feasible" jq -e --slurpfile c <(jq -c . "$tmp/explain") \
      'all(.gears[]; . as $g | [$g.replicas[].stages[].devices[]] as $d
         | any($c[]; .feasible and .tp==$g.tp and .pp==$g.pp and .dp==$g.dp and (.devices|sort)==($d|sort)))' "$out"
    # --explain's per-device table: one row per device of the table, each fitting its memory.
    check "$cn $m: --explain's device rows cover the table and fit" jq -e --slurpfile c <(jq -c . "$tmp/explain") \
      '[.gears[].replicas[].stages[].devices[]] | unique as $d
         | [$c[] | select(has("device_memory")) | .device_memory] as $rows
         | ($rows | map(.device) | sort) == $d
           and all($rows[]; .fits and .need_bytes <= .memory_bytes and .weights_bytes > 0)' "$out"
    check "$cn $m: devices once each, heads divisible, weight shards fit" \
      jq -e --slurpfile t "$tmp/$cn.topo.json" --argjson bpp "$bpp" '.model as $m
        | ($t[0].devices | map({key: .id, value: .memory_bytes}) | from_entries) as $mem
        | all(.gears[]; . as $g | [$g.replicas[].stages[].devices[]] as $d
            | ($d|length)==($d|unique|length) and ($m.n_heads % $g.tp)==0 and $g.tp*$g.pp*$g.dp==($d|length)
            and all($g.replicas[].stages[]; (.layers[1]-.layers[0]) as $n
                | all(.devices[]; $mem[.] != null and $m.n_params*$bpp*$n/$m.n_layers/$g.tp < $mem[.])))' "$out"
  done
done

a100=$tmp/a100-8x-nvlink.topo.json
check "a100 llama-7b: economy is one GPU, performance above it" \
  jq -e '.gears[0].name=="economy" and ([.gears[0].replicas[].stages[].devices[]]|length)==1 and (.gears|map(.name)|index("performance"))>0' "$tmp/a100-8x-nvlink.llama-7b.json"
check "a100 llama-70b: economy needs two 80 GB GPUs" \
  jq -e '.gears[0].name=="economy" and ([.gears[0].replicas[].stages[].devices[]]|length)==2' "$tmp/a100-8x-nvlink.llama-70b.json"
check "a100 llama-70b: tp divides 64 and 8" jq -e 'all(.gears[]; 8 % .tp == 0)' "$tmp/a100-8x-nvlink.llama-70b.json"
fp=$tmp/flexpipe-fragmented.topo.json
check "flexpipe: TP groups stay in one island" \
  jq -e --slurpfile t "$fp" '[$t[0].islands[] | .devices] as $is | all(.gears[].replicas[].stages[]; .devices as $d | any($is[]; . as $i | all($d[]; . as $x | $i|index($x))))' \
  "$tmp/flexpipe-fragmented.llama-7b.json"

# The stage split on the fragmented cluster: in every pipeline, a stage on slower devices (fewer
# TFLOP/s and fewer GB/s, from the topology) holds fewer layers than a stage on faster ones; the
# tables must have such pipelines for this to say anything.
for m in llama-7b llama-70b; do
  check "flexpipe $m: a slower card's stage holds fewer layers" jq -e --slurpfile t "$fp" '
    ($t[0].devices | map({key: .id, value: .}) | from_entries) as $dev
    | [.gears[].replicas[] | [.stages[] | {n: (.layers[1]-.layers[0]), d: $dev[.devices[0]]}]
       | combinations(2) | select(.[0].d.gemm_tflop_s < .[1].d.gemm_tflop_s and .[0].d.memory_bandwidth_gb_s < .[1].d.memory_bandwidth_gb_s)]
    as $pairs
    | ($pairs|length) > 0 and all($pairs[]; .[0].n < .[1].n)' "$tmp/flexpipe-fragmented.$m.json"
done
"$plan" --topology "$fp" --model "$models/llama-70b.json" --explain --json=short >/dev/null 2>"$tmp/explain"
check "flexpipe llama-70b --explain: rejected layouts name a device and the bytes short" \
  jq -e -s '[.[]|select(has("feasible") and (.feasible|not))] | length>0 and all(.[]; (.device|type)=="string" and .short_bytes>0 and (.reason|test("short")))' "$tmp/explain"

"$plan" --topology "$a100" --model "$models/llama-7b.json" --explain --json=short >"$tmp/out" 2>"$tmp/explain"
check "--explain: JSON Lines of candidates on stderr" \
  jq -e -s '[.[]|select(has("device_memory")|not)] | length>10 and all(.[]; has("tp") and has("feasible"))' "$tmp/explain"
check "--explain: stdout is still one table" test "$(wc -l <"$tmp/out")" -eq 1
"$plan" --topology "$a100" --model "$models/llama-7b.json" --max-gears 1 >"$tmp/out"
check "--max-gears 1: one gear, standard" jq -e '(.gears|length)==1 and .gears[0].name=="standard"' "$tmp/out"
"$plan" --topology "$a100" --model "$models/llama-70b.json" --layout tp8:tp=8 --layout tp4:tp=4 --layout tp2x2:tp=2,dp=2 >"$tmp/out"
check "--layout: exactly those layouts, in that order, normal gears" \
  jq -e '[.gears[] | [.name, .tp, .pp, .dp, .role, ([.replicas[].stages[].devices[]]|length)]]
    == [["tp8",8,1,1,"normal",8], ["tp4",4,1,1,"normal",4], ["tp2x2",2,1,2,"normal",4]]' "$tmp/out"
check "--layout: each one of --explain's feasible candidates" jq -e --slurpfile c <("$plan" --topology "$a100" \
  --model "$models/llama-70b.json" --explain 2>&1 >/dev/null | jq -c 'select(.feasible)') \
  'all(.gears[]; . as $g | any($c[]; .tp==$g.tp and .pp==$g.pp and .dp==$g.dp and .max_rps==$g.estimated.max_rps))' "$tmp/out"
"$plan" --topology - --model "$models/llama-7b.json" <"$a100" >"$tmp/out"
check "topology from stdin" jq -e '.kind=="ftp.gear-table/v1"' "$tmp/out"

expect_error() {  # expect_error NAME EXPECTED_RC PATTERN ARGS...
  local name=$1 want=$2 pattern=$3; shift 3
  "$plan" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  check "$name: exit $want" test $rc -eq "$want"
  check "$name: message" grep -qF -- "$pattern" "$tmp/err"
  check "$name: nothing on stdout" test ! -s "$tmp/out"
}
expect_error "wrong kind (model)" 2 "ftp-plan: error: $a100: kind: expected \"ftp.model-shape/v1\", got \"ftp.topology/v1\"" \
  --topology "$a100" --model "$a100"
expect_error "wrong kind (topology)" 2 "kind: expected \"ftp.topology/v1\", got \"ftp.model-shape/v1\"" \
  --topology "$models/llama-7b.json" --model "$models/llama-7b.json"
jq 'del(.hidden_size)' "$models/llama-7b.json" >"$tmp/nohidden.json"
expect_error "missing field" 2 "ftp-plan: error: $tmp/nohidden.json: hidden_size: missing required field" \
  --topology "$a100" --model "$tmp/nohidden.json"
jq '.n_kv_heads = 5' "$models/llama-7b.json" >"$tmp/kv5.json"
expect_error "n_kv_heads not dividing" 2 "n_kv_heads: must divide n_heads (32), got 5" --topology "$a100" --model "$tmp/kv5.json"
jq '.n_layers = 800 | .name = "llama-700b"' "$models/llama-70b.json" >"$tmp/huge.json"
expect_error "model that does not fit" 1 "ftp-plan: error: no gear fits: llama-700b needs" --topology "$a100" --model "$tmp/huge.json"
check "does not fit: names a device and bytes short" grep -qE "GB short on device n0\.gpu[0-9]" "$tmp/err"
expect_error "model that does not fit the fragmented cluster" 1 "ftp-plan: error: no gear fits: llama-700b needs" --topology "$fp" --model "$tmp/huge.json"
check "does not fit (fragmented): names a device and bytes short" grep -qE "GB short on device m[01]\.[a-z0-9.]+ \(needs [0-9.]+ GB, has [0-9.]+ GB\)" "$tmp/err"
expect_error "reference request too long" 2 "longer than the context" \
  --topology "$a100" --model "$models/stories260K.json" --prompt-tokens 500 --output-tokens 100
expect_error "reference request past INT_MAX" 2 "longer than the context" \
  --topology "$a100" --model "$models/llama-7b.json" --prompt-tokens 2147483647 --output-tokens 2147483647
expect_error "concurrency INT_MAX: no wrap" 1 "no gear fits" --topology "$a100" --model "$models/llama-7b.json" --concurrency 2147483647
jq '.n_layers = 2147483647' "$models/llama-7b.json" >"$tmp/layers.json"
expect_error "n_layers past the bound" 2 "$tmp/layers.json: n_layers: must be at most 4096, got 2147483647" --topology "$a100" --model "$tmp/layers.json"
sed 's/"n_layers": *[0-9]*/"n_layers": 18446744073709551615/' "$models/llama-7b.json" >"$tmp/layers64.json"
expect_error "integer past int64: no wrap" 2 "n_layers: integer 18446744073709551615 is too large" --topology "$a100" --model "$tmp/layers64.json"
expect_error "--layout that does not fit" 1 "ftp-plan: error: --layout one: tp=1 pp=1 dp=1 does not fit a100-8x-nvlink: memory: n0.gpu0 needs" \
  --topology "$a100" --model "$models/llama-70b.json" --layout one:tp=1
check "--layout that does not fit: bytes short" grep -qE "GB short$" "$tmp/err"
expect_error "--layout the topology cannot form" 1 "--layout x: tp=3 pp=1 dp=1 does not fit a100-8x-nvlink: no such layout" \
  --topology "$a100" --model "$models/llama-70b.json" --layout x:tp=3
expect_error "--layout malformed" 2 '--layout: tp: "q" is not a number in "x:tp=q"' --topology "$a100" --model "$models/llama-70b.json" --layout x:tp=q
expect_error "--layout without a name" 2 '--layout: no name in "tp=2"' --topology "$a100" --model "$models/llama-70b.json" --layout tp=2
expect_error "--layout name twice" 2 '--layout a: the name is given twice' --topology "$a100" --model "$models/llama-70b.json" --layout a:tp=2 --layout a:tp=4
expect_error "--layout over --max-pp" 2 '--layout a: pp=3 is over --max-pp 2' --topology "$a100" --model "$models/llama-7b.json" --layout a:tp=1,pp=3 --max-pp 2
expect_error "--layout with a key twice" 2 '--layout: tp given twice in "a:tp=2,tp=4"' --topology "$a100" --model "$models/llama-70b.json" --layout a:tp=2,tp=4
# Numbers beyond an int or a double are named, not cut or crashed on.
jq '.n_heads=4294967296 | .n_kv_heads=4294967296' "$models/llama-7b.json" >"$tmp/huge.json"
expect_error "model shape: n_heads over an int" 2 "n_heads: must be at most 2147483647, got 4294967296" --topology "$a100" --model "$tmp/huge.json"
sed 's/"memory_bandwidth_gb_s": *[0-9.e+]*/"memory_bandwidth_gb_s": 1e400/' "$a100" >"$tmp/overflow.json"
expect_error "a number beyond a double" 2 "overflow.json: number overflow" --topology "$tmp/overflow.json" --model "$models/llama-7b.json"
# An island whose devices have no link between them prices no TP group as free.
jq '.links=[] | .fabrics=[] | .islands[].allreduce=null' "$a100" >"$tmp/nolinks.json"
"$plan" --topology "$tmp/nolinks.json" --model "$models/llama-7b.json" --explain >"$tmp/out" 2>"$tmp/explain"
check "no links: no TP group in the table" jq -e 'all(.gears[]; .tp == 1)' "$tmp/out"
check "no links: --explain names the missing link" grep -q "no link between .* inside a tensor-parallel group" "$tmp/explain"
jq '.nodes[0].devices[0].count=5000' "$src/examples/clusters/a100-8x-nvlink.json" >"$tmp/huge-island.json"
"$probe" --cluster "$tmp/huge-island.json" >/dev/null 2>"$tmp/err"; rc=$?
check "an island of 5000 devices: refused, exit 2" test $rc -eq 2
check "an island of 5000 devices: says so" grep -q "an island of 5000 devices" "$tmp/err"
jq '.islands += [.islands[0]]' "$a100" >"$tmp/dupisland.json"
expect_error "duplicate island id" 2 "islands[1].id: duplicate island" --topology "$tmp/dupisland.json" --model "$models/llama-7b.json"
expect_error "missing --model" 2 "ftp-plan: error:" --topology "$a100"
expect_error "missing file" 2 "/nonexistent.json: cannot open" --topology "$a100" --model /nonexistent.json

# A model file instead of a shape: hyper-parameters and parameters from the file.
gguf=${FTP_TEST_DATA:-}/models/stories260K/stories260K.gguf
if [ -f "$gguf" ]; then
  "$plan" --topology "$a100" --model "$gguf" --json=short >"$tmp/gguf.json" 2>"$tmp/err"; rc=$?
  check "GGUF model: exit 0" test $rc -eq 0
  check "GGUF model: shape from the file" jq -e '.model.n_layers==5 and .model.n_heads==8 and .model.n_kv_heads==4 and .model.n_params==292800' "$tmp/gguf.json"
  head -c 1000 "$gguf" >"$tmp/trunc.gguf"
  "$plan" --topology "$a100" --model "$tmp/trunc.gguf" >/dev/null 2>"$tmp/err"; rc=$?
  check "truncated GGUF model: exit 2" test $rc -eq 2
  check "truncated GGUF model: names the file" grep -q "trunc.gguf" "$tmp/err"
else
  echo "SKIP: stories260K.gguf not found (set FTP_TEST_DATA): GGUF input not checked"
fi

finish
