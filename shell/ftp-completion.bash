# Bash completion for the flextp tools: source this file, or install it as
# /usr/share/bash-completion/completions/ftp-probe.

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
