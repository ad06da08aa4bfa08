#!/usr/bin/env bash
# Issue 27 on a lent GPU machine (the device tool): p2pkit's engine, model, service and bench stages
# for llama.cpp on a real GPU, by phases, each one device call (a call is at most 10 minutes; the
# machine keeps /tmp while it stays warm between calls):
#   bash bench/gpu_engine_run.sh build    the engine stage twice (first build; re-configure + no-op rebuild)
#   bash bench/gpu_engine_run.sh models   a 0.76B and a 7M random-weight Llama made there, converted by the
#                                         model stage (llama.cpp's own converter)
#   bash bench/gpu_engine_run.sh serve    the service stage (the launcher: no systemd there), bench with an
#                                         A/B (drafting off / on), status, serve status and stop
#   bash bench/gpu_engine_run.sh all      all of it in one call (a machine does not keep /tmp once given back):
#                                         the conversion beside the build, then llama-bench's four formats
# The source travels as the packed archive of `p2pkit pin --engine-offline` in .devcarry/, ansible-core
# and pyudev as wheels in .whl/ (both carried). Each phase tars its records into $OUT/rec-PHASE.tar.gz
# when it ends, so a call cut short still brings back the phases it finished.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
W=/tmp/p2pkit-gpu
PROFILE=bench/h200-llamacpp.toml
SRC=$PWD/.devcarry/llama.cpp-0c1e570.tar.xz
SETS=(--set "engine.source_url=$SRC")
mkdir -p "$W"
REC=
log() { echo "# $(date -u +%T) $*" | tee -a "$REC/run.log"; }
begin() { REC=$OUT/$1; mkdir -p "$REC"; log "phase $1"; }
end() { log "end of $1"; tar -C "$OUT" -czf "$OUT/rec-$1.tar.gz" "$1" && rm -rf "${OUT:?}/$1"; }
if [ -d .whl ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD:/tmp/site:$W/llama.cpp/gguf-py PATH=/tmp/site/bin:$PATH
get() { python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"; }
stages() { python3 bench/gpu_stages.py --profile "$PROFILE" "${SETS[@]}" "$@"; }

nccl_root() {  # the pip wheel's NCCL as FindNCCL wants it: include/nccl.h, lib/libnccl.so
  local w; w=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])')
  mkdir -p "$W/nccl/lib"; ln -sfn "$w/include" "$W/nccl/include"
  ln -sf "$w/lib/libnccl.so.2" "$W/nccl/lib/libnccl.so.2"; ln -sf "$w/lib/libnccl.so.2" "$W/nccl/lib/libnccl.so"
}

phase_build() {
  begin build
  { date -u; uname -r; nvidia-smi -L; nvcc --version | tail -2; cmake --version | head -1; ninja --version
    echo "pid1: $(cat /proc/1/comm)"; echo "cgroup: $(cat /proc/self/cgroup)"; stat -fc %T /sys/fs/cgroup
    cg=$(cut -d: -f3 /proc/self/cgroup); d=/sys/fs/cgroup$cg
    while [ "$d" != /sys/fs ]; do echo "$d memory.max=$(cat "$d/memory.max" 2>/dev/null)"; d=$(dirname "$d"); done
    nproc; free -g | head -2; ansible-playbook --version | head -1; } >"$REC/env.txt" 2>&1
  nvcc --list-gpu-arch >"$REC/nvcc-list-gpu-arch.txt" 2>&1
  nccl_root
  log "engine stage: first build"; t0=$(date +%s)
  stages --state-dir "$W/state" engine 2>&1 | tee "$REC/engine-1.txt"
  log "engine stage 1 took $(( $(date +%s) - t0 )) s"
  log "engine stage: again (re-configure, no-op rebuild)"; t0=$(date +%s)
  stages --state-dir "$W/state" engine 2>&1 | tee "$REC/engine-2.txt"
  log "engine stage 2 took $(( $(date +%s) - t0 )) s"
  cp "$W"/state/logs/engine-build-000*.log "$REC/" 2>/dev/null
  cp "$W/state/engine.json" "$REC/engine.artifact.json"
  b=$W/llama.cpp/build
  cmake --build "$b" --target llama-server llama-bench llama-batched-bench -- -n >"$REC/ninja-dry-run.txt" 2>&1
  cp "$b/CMakeCache.txt" "$REC/"
  ldd "$b/bin/llama-server" >"$REC/ldd-llama-server.txt" 2>&1
  ldd "$b/bin/libggml-cuda.so" >"$REC/ldd-libggml-cuda.txt" 2>&1
  end build
}

phase_models() {  # needs only the unpacked source (the converter and gguf-py), not the built binaries
  begin models
  log "making the checkpoints"
  python3 bench/gpu_model.py main "$W/src/main" | tee "$REC/model-main.json"
  python3 bench/gpu_model.py draft "$W/src/draft" | tee "$REC/model-draft.json"
  log "model stage: main"; t0=$(date +%s)
  stages --state-dir "$W/state-model" model 2>&1 | tee "$REC/model-stage-main.txt"
  log "model stage main took $(( $(date +%s) - t0 )) s"
  stages --state-dir "$W/state-draft" --set "model.source=$W/src/draft" \
    --set "model.output=$W/models/draft-bf16.gguf" model 2>&1 | tee "$REC/model-stage-draft.txt"
  cp "$W/state-model/model.json" "$REC/model.artifact.json"
  end models
}

phase_bench_formats() {  # llama-bench's four formats from the GPU build, for the package's reader
  begin formats
  lb=$W/llama.cpp/build/bin/llama-bench
  for fmt in md json jsonl csv; do
    "$lb" -m "$W/models/main-bf16.gguf" -ngl 99 -fa on -p 64 -n 32 -d 0,64 -r 2 -o $fmt >"$REC/llama-bench.$fmt" 2>&1
  done
  "$lb" -m "$W/models/missing.gguf" -o json >"$REC/llama-bench-missing.txt" 2>&1; echo "exit $?" >>"$REC/llama-bench-missing.txt"
  end formats
}

phase_serve() {
  begin serve
  SETS+=(--set "serve.flags.model-draft=$W/models/draft-bf16.gguf" --set "serve.flags.spec-type=none")
  # what a GPU box's udev and base system give (the engine runs as its own user, in the video and render
  # groups): recorded, and put right only where this VM lacks it
  { ls -l /dev/nvidia* ; getent group video render; } >"$REC/devices.txt" 2>&1
  for g in video render; do getent group $g >/dev/null || { groupadd -r $g && log "made group $g"; }; done
  for d in /dev/nvidia*; do [ -c "$d" ] || continue
    perm=$(stat -c %a "$d"); case "$perm" in *6) ;; *) chgrp video "$d" && chmod g+rw "$d" && log "$d: video rw";; esac
  done
  log "service stage (drafting off: the draft loaded, --spec-type none)"
  stages --state-dir "$W/state" service 2>&1 | tee "$REC/service-stage.txt"
  cp "$W/state/service.json" "$REC/service.artifact.json"
  pid=$(python3 -c 'import json; print(json.load(open("/run/p2pkit/engine-launcher.json"))["pid"])')
  { echo "engine pid $pid"; cat /proc/$pid/cgroup; cg=$(cut -d: -f3 /proc/$pid/cgroup); d=/sys/fs/cgroup$cg
    while [ "$d" != /sys/fs ]; do echo "$d memory.max=$(cat "$d/memory.max" 2>/dev/null)"; d=$(dirname "$d"); done
    echo "p2pkit's own: $(cat /proc/self/cgroup)"; cat /run/p2pkit/engine-launcher.json; } >"$REC/engine-cgroup.txt" 2>&1
  get "http://127.0.0.1:18080/metrics" >"$REC/metrics-before.txt" 2>&1
  P=(python3 -m p2pkit --profile "$PROFILE" "${SETS[@]}" --state-dir "$W/state")
  "${P[@]}" serve status >"$REC/serve-status.txt" 2>&1
  log "bench: two shapes x 1,2,4,8 streams, A/B drafting on, llama-bench reference"; t0=$(date +%s)
  python3 bench/gpu_bench.py --profile "$PROFILE" "${SETS[@]}" --state-dir "$W/state" --shapes decode,production \
    --concurrency 1,2,4,8 --requests 2 --warmup 1 --reference --ab serve.flags.spec-type=draft-simple \
    --out "$REC/bench.json" --plot "$OUT/bench.png" 2>&1 | tee "$REC/bench.txt"
  log "bench took $(( $(date +%s) - t0 )) s"
  get "http://127.0.0.1:18080/metrics" >"$REC/metrics-after.txt" 2>&1
  "${P[@]}" status >"$REC/status.txt" 2>&1; echo "status exit $?" >>"$REC/status.txt"
  "${P[@]}" serve stop >"$REC/serve-stop.txt" 2>&1; echo "stop exit $?" >>"$REC/serve-stop.txt"
  "${P[@]}" serve status >>"$REC/serve-stop.txt" 2>&1
  cp "$W"/state/logs/engine-launcher.log "$REC/" 2>/dev/null
  end serve
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0  # sourced (bench/gpu_numbers_run.sh): the phases only
case "${1:-}" in
build) phase_build ;;
models) phase_models ;;
serve) phase_bench_formats; phase_serve ;;
all)  # the conversion runs beside the build (it needs the unpacked source only): one call fits in 10 minutes
  phase_build & bpid=$!
  for _ in $(seq 120); do [ -f "$W/llama.cpp/convert_hf_to_gguf.py" ] && break; sleep 1; done
  phase_models
  wait "$bpid"
  phase_bench_formats
  phase_serve ;;
*) echo "usage: gpu_engine_run.sh build|models|serve|all" >&2; exit 2 ;;
esac
ls -la "$OUT"
