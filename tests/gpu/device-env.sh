# Sourced by tests/gpu/run-on-device.sh, issue17-on-device.sh and issue19-on-device.sh
# on the lent device machine.
#
# unpack_pack PACK_DIR WORK: unpacks PACK_DIR/ftp-gpu.tar.xz (or an older
# pack's ftp-gpu.tar.gz) into a fresh WORK, with tar, or with python3's
# tarfile where tar cannot run xz. Returns 1, saying why, when it cannot.
unpack_pack() {
  local pack=$1 work=$2
  rm -rf "$work"; mkdir -p "$work"
  if [ -f "$pack/ftp-gpu.tar.xz" ]; then
    tar -C "$work" -xJf "$pack/ftp-gpu.tar.xz" 2>/dev/null ||
      { rm -rf "$work"; mkdir -p "$work"
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$pack/ftp-gpu.tar.xz" "$work"; } ||
      { echo "device-env: cannot unpack $pack/ftp-gpu.tar.xz (neither tar -J nor python3 tarfile)"; return 1; }
  elif [ -f "$pack/ftp-gpu.tar.gz" ]; then
    tar -C "$work" -xzf "$pack/ftp-gpu.tar.gz" || { echo "device-env: cannot unpack $pack/ftp-gpu.tar.gz"; return 1; }
  else
    echo "device-env: no ftp-gpu.tar.xz in $pack (tests/gpu/pack-for-device.sh makes it)"; return 1
  fi
}

# device_env WORK puts the pack's libraries
# (WORK/lib) and this machine's CUDA libraries (cudart, cuBLAS, NCCL: the
# toolkit, the loader cache, or the NVIDIA Python wheels that PyTorch images
# carry; the driver's libcuda and NVML) on LD_LIBRARY_PATH, and sets
# FTP_TEST_DATA to WORK/data. Returns 1, saying which, when a library is missing.
device_env() {
  local work=$1 libdirs=$1/lib lib found
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
    if [ -z "$found" ]; then
      found=$(find /usr/local/cuda*/ /usr/local/lib /usr/lib /opt \
                $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
                -name "$lib" 2>/dev/null | head -1)
    fi
    if [ -z "$found" ]; then echo "device-env: $lib not found on this machine"; return 1; fi
    libdirs=$libdirs:$(dirname "$found")
    echo "using $found"
  done
  # The driver's libcuda.so.1 and libnvidia-ml.so.1 where the loader cache
  # does not list them (a driver mount).
  for lib in libcuda.so.1 libnvidia-ml.so.1; do
    if ! ldconfig -p 2>/dev/null | grep -q "$lib "; then
      found=$(find /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/lib64 -name "$lib" 2>/dev/null | head -1)
      [ -n "$found" ] && libdirs=$libdirs:$(dirname "$found") && echo "using $found"
    fi
  done
  export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export FTP_TEST_DATA=$work/data
}

# device_run NAME LIMIT CMD...: runs CMD for at most LIMIT seconds and never
# past $deadline (SECONDS), its output to the terminal and to
# $log_dir/NAME.log, and counts it in pass, fail or skip (exit 77: the GPU
# or the data was not found, worth a look). A step with under
# $device_min_step seconds left (default 1) is not run and counts as failed.
device_run() {
  local name=$1 limit=$2; shift 2
  local left=$((deadline - SECONDS))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt "${device_min_step:-1}" ]; then echo "=== $name: not run, $left s of the budget left"; fail=$((fail + 1)); return; fi
  echo "=== $name (limit $limit s)"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$log_dir/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  case $rc in 0) pass=$((pass + 1)) ;; 77) skip=$((skip + 1)); echo "=== $name SKIPPED: see its first line" ;; *) fail=$((fail + 1)) ;; esac
}
