#!/bin/bash
# The daemon half of the device run in a bare root: ftp-serve, ftp-shift and
# shift-load with only the libraries pack-libs.sh packs for them, in a
# chroot (unshare -rm: no privileges needed) that holds nothing else but
# glibc, libstdc++/libgcc_s, the CUDA libraries they link (bound read-only
# from where they are here) and the shell tools shift-under-load.sh calls.
# A library or file the programs open at run time that the pack lacks
# (a dlopen, a data file) fails here, as it would on the lent machine; the
# ldd check of pack-libs.sh sees only what is linked.
#
#   pack-bare-root.sh SERVE SHIFT LOAD DATA_DIR
# Runs shift-under-load.sh --backend cpu on stories260K (4 shifts, 4
# clients). Exits 77 where unshare or the data is not available.
set -u
serve=$1; shift_tool=$2; load_tool=$3; data=$4
here=$(cd "$(dirname "$0")" && pwd)
s260=$data/models/stories260K
[ -f "$s260/stories260K.gguf" ] || { echo "SKIP: $s260/stories260K.gguf not found"; exit 77; }
unshare -rm true 2>/dev/null || { echo "SKIP: unshare -rm is not permitted here"; exit 77; }
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
mkdir -p "$R/lib64" "$R/lib/x86_64-linux-gnu" "$R/usr/bin" "$R/bin" "$R/toollib" "$R/pack/bin" "$R/proc" "$R/sys" \
  "$R/dev" "$R/tmp" "$R/data" "$R/scripts"
chmod 1777 "$R/tmp"

# The system part: what pack-libs.sh leaves to the device machine.
binds=()
while read -r name path; do
  case $name in
    libcudart*|libcublas*|libnccl*|libcuda.so*|libnvidia-ml*)
      d=$(dirname "$(readlink -f "$path")")
      case " ${binds[*]} " in *" $d:"*) continue ;; esac
      n=${#binds[@]}
      mkdir -p "$R/cuda$n"
      binds+=("$d:$R/cuda$n") ;;
    ld-linux*) cp -L "$path" "$R/lib64/" ;;
    *) cp -L "$path" "$R/lib/x86_64-linux-gnu/$name" ;;
  esac
done < <(for p in "$serve" "$shift_tool" "$load_tool"; do
           ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3} $1 ~ /^\/.*ld-linux/ {print "ld-linux", $1}'
         done | sort -u | while read -r name path; do
           case $name in
             ld-linux|libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libresolv.so*|libutil.so*|libstdc++.so*|libgcc_s.so*|\
             libcudart*|libcublas*|libnccl*|libcuda.so*|libnvidia-ml*) echo "$name $path" ;;
           esac
         done)
# The pack's part.
"$here/pack-libs.sh" copy "$R/pack/lib" "$serve" "$shift_tool" "$load_tool" || exit 1
cp "$serve" "$shift_tool" "$load_tool" "$R/pack/bin/"
# The shell tools of shift-under-load.sh, their libraries apart.
for t in bash sed grep mawk date timeout seq cmp tail wc sleep cat rm mkdir mktemp env tee; do
  p=$(type -P "$t") || { echo "SKIP: no $t here"; exit 77; }
  cp "$(readlink -f "$p")" "$R/usr/bin/$t"
  ldd "$p" | awk '$3 ~ /^\// {print $3}' | while read -r l; do
    [ -f "$R/lib/x86_64-linux-gnu/$(basename "$l")" ] || cp -Ln "$l" "$R/toollib/" 2>/dev/null
  done
done
ln -s mawk "$R/usr/bin/awk"; ln -s /usr/bin/bash "$R/bin/bash"; ln -s /usr/bin/bash "$R/bin/sh"

cuda_path=
mounts="mount --rbind /proc $R/proc && mount --rbind /sys $R/sys && mount --rbind /dev $R/dev"
mounts="$mounts && mount --bind $s260/.. $R/data && mount --bind $here $R/scripts"
for b in "${binds[@]}"; do
  mounts="$mounts && mount --bind ${b%%:*} ${b#*:}"
  target=${b#*:}
  cuda_path=$cuda_path:${target#"$R"}
done
unshare -rm sh -c "$mounts && chroot $R /usr/bin/env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH=/pack/lib$cuda_path:/toollib \
  bash /scripts/shift-under-load.sh --bin /pack/bin --backend cpu --model /data/stories260K/stories260K.gguf \
  --golden /data/stories260K/golden_greedy_t0_prompt_Zoo_steps60.txt --shifts 4 --clients 4 --step-interval 20 \
  --steady-ms 500 --gap-ms 200 --timings info --limit 100"
