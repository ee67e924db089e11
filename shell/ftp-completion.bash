# Bash completion for the flextp tools: source this file, or install it as
# /usr/share/bash-completion/completions/ftp-probe with a link of the same
# folder for each of the other tools (ftp-plan, ftp-gear-bench, ftp-serve,
# ftp-shift, ftp-drain): bash-completion loads the file named after the command.

_ftp_probe() {
  local cur prev
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  case $prev in
    --json) COMPREPLY=($(compgen -W "pretty short" -- "$cur")); return ;;
    --cluster) COMPREPLY=($(compgen -f -X '!*.json' -- "$cur") $(compgen -d -- "$cur")); return ;;
    -n|--virtual-devices) COMPREPLY=($(compgen -W "2 4 8" -- "$cur")); return ;;
  esac
  if [[ $cur == --json=* ]]; then
    COMPREPLY=($(compgen -W "--json=pretty --json=short" -- "$cur")); return
  fi
  COMPREPLY=($(compgen -W "--help --version --json --quick --no-gpu --virtual-devices --cluster --watch --gather --interval --count --socket" -- "$cur"))
}
complete -F _ftp_probe ftp-probe

_ftp_plan() {
  local cur prev i sub=
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  for ((i = 1; i < COMP_CWORD; i++)); do [[ ${COMP_WORDS[i]} == decide || ${COMP_WORDS[i]} == simulate ]] && sub=${COMP_WORDS[i]}; done
  if [[ $sub == simulate ]]; then
    case $prev in
      --policy) COMPREPLY=($(compgen -W "gear-shifter dynamic-tp naive static:" -- "$cur")); return ;;
      --trace) COMPREPLY=($(compgen -f -X '!*.@(csv|jsonl)' -- "$cur") $(compgen -d -- "$cur")); return ;;
      --summary) COMPREPLY=($(compgen -f -- "$cur")); return ;;
      --rate-pattern) COMPREPLY=($(compgen -W "const: steps: day:" -- "$cur")); return ;;
      --service) COMPREPLY=($(compgen -W "engine queueing" -- "$cur")); return ;;
      --prompt-lengths|--output-lengths) COMPREPLY=($(compgen -W "const: uniform: lognormal:" -- "$cur")); return ;;
      --calibration) COMPREPLY=($(compgen -f -X '!*.json' -- "$cur") $(compgen -d -- "$cur")); return ;;
      --max-running|--block-tokens|--route-long-prompt-tokens|--tail-s|--warm-s|--weight-load-gb-s|--start-gear|--burstiness|--seed|--start|--duration|--rate-scale|--interval|--observe-interval-s|--slo-ttft-ms|--slo-tpot-ms|--service-time-s|--prefill-share|--shift-duration-s) return ;;
    esac
  fi
  case $prev in
    --json) COMPREPLY=($(compgen -W "pretty short" -- "$cur")); return ;;
    --topology|--model|--gears|--policy) COMPREPLY=($(compgen -f -X '!*.json' -- "$cur") $(compgen -d -- "$cur")); return ;;
    --policy-name) COMPREPLY=($(compgen -W "gear-shifter tp-planner naive" -- "$cur")); return ;;
    --concurrency) COMPREPLY=($(compgen -W "1 8 32 128" -- "$cur")); return ;;
    --context|--prompt-tokens|--output-tokens|--max-batched-tokens) COMPREPLY=($(compgen -W "128 512 2048 4096" -- "$cur")); return ;;
    --max-gears|--max-pp) COMPREPLY=($(compgen -W "1 2 4 8" -- "$cur")); return ;;
    --layout) COMPREPLY=($(compgen -W "tp1:tp=1 tp2:tp=2 tp4:tp=4 tp8:tp=8" -- "$cur")); return ;;
  esac
  if [[ $cur == --json=* ]]; then
    COMPREPLY=($(compgen -W "--json=pretty --json=short" -- "$cur")); return
  fi
  if [[ $sub == decide ]]; then
    COMPREPLY=($(compgen -W "--help --gears --policy --policy-name" -- "$cur")); return
  fi
  if [[ $sub == simulate ]]; then
    COMPREPLY=($(compgen -W "--help --service --gears --topology --model --trace --rate-pattern --burstiness --seed --prompt-lengths --output-lengths --policy --start-gear --start --duration --rate-scale --interval --observe-interval-s --slo-ttft-ms --slo-tpot-ms --calibration --max-running --block-tokens --route-long-prompt-tokens --tail-s --warm-s --weight-load-gb-s --service-time-s --prefill-share --shift-duration-s --summary" -- "$cur")); return
  fi
  COMPREPLY=($(compgen -W "decide simulate --help --version --json --topology --model --concurrency --context --prompt-tokens --output-tokens --max-batched-tokens --max-gears --max-pp --layout --explain" -- "$cur"))
}
complete -F _ftp_plan ftp-plan

_ftp_serve() {
  local cur prev
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  case $prev in
    --json) COMPREPLY=($(compgen -W "pretty short" -- "$cur")); return ;;
    -m|--model) COMPREPLY=($(compgen -f -X '!*.@(gguf|bin|json)' -- "$cur") $(compgen -d -- "$cur")); return ;;
    --tokenizer) COMPREPLY=($(compgen -f -X '!*.bin' -- "$cur") $(compgen -d -- "$cur")); return ;;
    --gears|--topology|--calibration) COMPREPLY=($(compgen -f -X '!*.json' -- "$cur") $(compgen -d -- "$cur")); return ;;
    --engine) COMPREPLY=($(compgen -W "real sim" -- "$cur")); return ;;
    --config-dir|--state-dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --kv-cache-dtype) COMPREPLY=($(compgen -W "auto f16 bf16 f32" -- "$cur")); return ;;
    --backend) COMPREPLY=($(compgen -W "cpu cuda" -- "$cur")); return ;;
    --socket|--secret-file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --gear) COMPREPLY=($(compgen -W "tp=1,pp=1 tp=2,pp=1 tp=4,pp=1 tp=1,pp=2 tp=2,pp=2" -- "$cur")); return ;;
    -p|--prompt|--stop|-s|--seed|-t|--temperature|--top-k|--top-p|-n|--max-tokens|--virtual-device-memory) return ;;
  esac
  if [[ $cur == --json=* ]]; then
    COMPREPLY=($(compgen -W "--json=pretty --json=short" -- "$cur")); return
  fi
  COMPREPLY=($(compgen -W "--help --version --json --model --engine --backend --topology --calibration --tokenizer --gears --gear --start-gear --virtual-devices --host --port --socket --config-dir --enable-test-hooks --api-key --cors-origin --http-threads --kv-blocks --max-running --max-batched-tokens --max-tokens-limit --max-prompt-tokens --route-long-prompt --ramp --step-interval-ms --drain-timeout-ms --auto --policy --policy-name --observe-interval-ms --prompt --max-tokens --temperature --top-k --top-p --seed --stop --members-listen --machine-name --wait-members --join --secret-file --name --gloo-host --gloo-timeout-ms --served-model-name --kv-cache-dtype --state-dir --max-waiting-requests --max-waiting-tokens --domain-max-waiting-requests --domain-max-waiting-tokens --max-header-bytes --max-headers --max-body-bytes --header-timeout-ms --body-timeout-ms --idle-timeout-ms --max-connections --max-connections-per-address --stream-buffer-bytes --rerun-wait-ms --device-memory --virtual-device-memory" -- "$cur"))
}
shopt -s extglob 2>/dev/null
complete -F _ftp_serve ftp-serve

# The gear names of the running daemon's table, for --to.
_ftp_gear_names() {
  local sock=${FTP_SOCKET:-${XDG_RUNTIME_DIR:-/run}/flextp/control.sock}
  [ -S "$sock" ] || return
  command -v jq >/dev/null || return
  printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"gears"}' | timeout 1 socat - "UNIX-CONNECT:$sock" 2>/dev/null |
    jq -r '.result.gears[].name' 2>/dev/null
}

_ftp_shift() {
  local cur prev
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  case $prev in
    --json) COMPREPLY=($(compgen -W "pretty short" -- "$cur")); return ;;
    --to) COMPREPLY=($(compgen -W "$(_ftp_gear_names)" -- "$cur")); return ;;
    --ramp) COMPREPLY=($(compgen -W "0.1,0.5,1.0 0.5,1.0 1.0" -- "$cur")); return ;;
    --inject-fault) COMPREPLY=($(compgen -W "check" -- "$cur")); return ;;
    --socket) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --step-interval|--trigger|--since) return ;;
  esac
  COMPREPLY=($(compgen -W "--help --version --json --to --ramp --step-interval --trigger --follow --queue --from-stdin --socket --inject-fault --history --since" -- "$cur"))
}
complete -F _ftp_shift ftp-shift

_ftp_drain() {
  local cur prev
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  case $prev in
    --json) COMPREPLY=($(compgen -W "pretty short" -- "$cur")); return ;;
    --socket) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --domain|--devices|--timeout) return ;;
  esac
  COMPREPLY=($(compgen -W "--help --version --json --domain --devices --force --timeout --follow --socket" -- "$cur"))
}
complete -F _ftp_drain ftp-drain

_ftp_gear_bench() {
  local cur prev
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  case $prev in
    --json) COMPREPLY=($(compgen -W "pretty short" -- "$cur")); return ;;
    --gear) COMPREPLY=($(compgen -W "$(_ftp_gear_names)" -- "$cur")); return ;;
    --arrivals) COMPREPLY=($(compgen -W "poisson gamma constant" -- "$cur")); return ;;
    --gears|--samples|--socket|--trace) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --url) COMPREPLY=($(compgen -W "http://127.0.0.1:8080" -- "$cur")); return ;;
    --model|--api-key|--rate|--sweep|--burstiness|--duration|--requests|--prompt-tokens|--output-tokens|--seed|\
    --slo-ttft-ms|--slo-tpot-ms|--slo-latency-ms|--min-attainment|--min-keep-up|--timeout|--min-throughput) return ;;
  esac
  COMPREPLY=($(compgen -W "--help --version --json --url --model --api-key --gear --shift --socket --gears --write-capacity
    --rate --sweep --trace --arrivals --burstiness --duration --requests --prompt-tokens --output-tokens --seed --slo-ttft-ms
    --slo-tpot-ms --slo-latency-ms --min-attainment --min-keep-up --timeout --samples --min-throughput" -- "$cur"))
}
complete -F _ftp_gear_bench ftp-gear-bench
