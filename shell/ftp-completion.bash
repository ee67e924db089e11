# Bash completion for the flextp tools: source this file, or install it as
# /usr/share/bash-completion/completions/ftp-probe (and a link ftp-plan).

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
  COMPREPLY=($(compgen -W "--help --version --json --quick --no-gpu --virtual-devices --cluster" -- "$cur"))
}
complete -F _ftp_probe ftp-probe

_ftp_plan() {
  local cur prev
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  case $prev in
    --json) COMPREPLY=($(compgen -W "pretty short" -- "$cur")); return ;;
    --topology|--model) COMPREPLY=($(compgen -f -X '!*.json' -- "$cur") $(compgen -d -- "$cur")); return ;;
    --concurrency) COMPREPLY=($(compgen -W "1 8 32 128" -- "$cur")); return ;;
    --context|--prompt-tokens|--output-tokens|--max-batched-tokens) COMPREPLY=($(compgen -W "128 512 2048 4096" -- "$cur")); return ;;
    --max-gears|--max-pp) COMPREPLY=($(compgen -W "1 2 4 8" -- "$cur")); return ;;
  esac
  if [[ $cur == --json=* ]]; then
    COMPREPLY=($(compgen -W "--json=pretty --json=short" -- "$cur")); return
  fi
  COMPREPLY=($(compgen -W "--help --version --json --topology --model --concurrency --context --prompt-tokens --output-tokens --max-batched-tokens --max-gears --max-pp --explain" -- "$cur"))
}
complete -F _ftp_plan ftp-plan
