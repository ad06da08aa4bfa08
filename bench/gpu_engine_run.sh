#!/usr/bin/env bash
# Issue 27 on a lent GPU machine (the device tool): p2pkit's engine, model, service and bench stages
# for llama.cpp on a real GPU, by phases, each one device call (a call is at most 10 minutes; the
# machine keeps /tmp while it stays warm between calls):
#   bash bench/gpu_engine_run.sh build    the engine stage twice (first build; re-configure + no-op rebuild)
#   bash bench/gpu_engine_run.sh models   a 0.76B and a 7M random-weight Llama made there, converted by the
#                                         model stage (llama.cpp's own converter), llama-bench references
#   bash bench/gpu_engine_run.sh serve    the service stage (the launcher: no systemd there), bench, stop
# The source travels as the packed archive of `p2pkit pin --engine-offline` in .devcarry/ (carried).
# Everything for the record lands in $OUT/ (at most 8 files come back: each phase makes one tar).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
W=/tmp/p2pkit-gpu
PROFILE=bench/h200-llamacpp.toml
SRC=$PWD/.devcarry/llama.cpp-0c1e570.tar.xz
SETS=(--set "engine.source_url=$SRC")
REC=$OUT/rec; mkdir -p "$REC" "$W"
log() { echo "# $(date -u +%T) $*" | tee -a "$REC/run.log"; }
stages() { python3 bench/gpu_stages.py --profile "$PROFILE" "${SETS[@]}" "$@"; }

nccl_root() {  # the pip wheel's NCCL as FindNCCL wants it: include/nccl.h, lib/libnccl.so
  local w; w=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])')
  mkdir -p "$W/nccl/lib"; ln -sfn "$w/include" "$W/nccl/include"
  ln -sf "$w/lib/libnccl.so.2" "$W/nccl/lib/libnccl.so.2"; ln -sf "$w/lib/libnccl.so.2" "$W/nccl/lib/libnccl.so"
}

case "${1:-}" in
build)
  { date -u; uname -r; nvidia-smi -L; nvcc --version | tail -2; cmake --version | head -1; ninja --version
    echo "pid1: $(cat /proc/1/comm)"; echo "cgroup: $(cat /proc/self/cgroup)"; stat -fc %T /sys/fs/cgroup
    nproc; free -g | head -2; } >"$REC/env.txt" 2>&1
  nvcc --list-gpu-arch >"$REC/nvcc-list-gpu-arch.txt" 2>&1
  nccl_root
  log "engine stage: first build"; t0=$(date +%s)
  stages --state-dir "$W/state" engine 2>&1 | tee "$REC/engine-1.txt"
  log "engine stage 1 took $(( $(date +%s) - t0 )) s"
  cp "$W"/state/logs/engine-build-0001-*.log "$REC/" 2>/dev/null
  log "engine stage: again (re-configure, no-op rebuild)"; t0=$(date +%s)
  stages --state-dir "$W/state" engine 2>&1 | tee "$REC/engine-2.txt"
  log "engine stage 2 took $(( $(date +%s) - t0 )) s"
  cp "$W"/state/logs/engine-build-0002-*.log "$REC/" 2>/dev/null
  cp "$W/state/engine.json" "$REC/engine.artifact.json"
  b=$W/llama.cpp/build
  cmake --build "$b" --target llama-server llama-bench -- -n >"$REC/ninja-dry-run.txt" 2>&1
  ldd "$b/bin/llama-server" >"$REC/ldd-llama-server.txt" 2>&1
  ldd "$(ls "$b"/bin/libggml-cuda.so* | head -1)" >"$REC/ldd-libggml-cuda.txt" 2>&1
  readelf -d "$(ls "$b"/bin/libggml-cuda.so* | head -1)" | grep -E 'RUNPATH|RPATH|NEEDED' >"$REC/readelf-libggml-cuda.txt"
  cuobjdump --list-elf "$(ls "$b"/bin/libggml-cuda.so* | head -1)" 2>&1 | head -20 >"$REC/cuobjdump-list-elf.txt"
  "$b/bin/llama-server" --help >"$REC/llama-server-help-cuda.txt" 2>&1
  "$b/bin/llama-bench" --help >"$REC/llama-bench-help.txt" 2>&1
  ;;
models)
  export PYTHONPATH=$PWD:$W/llama.cpp/gguf-py
  log "making the checkpoints"
  python3 bench/gpu_model.py main "$W/src/main" | tee "$REC/model-main.json"
  python3 bench/gpu_model.py draft "$W/src/draft" | tee "$REC/model-draft.json"
  mkdir -p "$W/models"
  log "model stage: main"; t0=$(date +%s)
  stages --state-dir "$W/state" model 2>&1 | tee "$REC/model-stage-main.txt"
  log "model stage main took $(( $(date +%s) - t0 )) s"
  log "model stage: draft"
  stages --state-dir "$W/state-draft" --set "model.source=$W/src/draft" \
    --set "model.output=$W/models/draft-bf16.gguf" model 2>&1 | tee "$REC/model-stage-draft.txt"
  cp "$W/state/model.json" "$REC/model.artifact.json"
  lb=$W/llama.cpp/build/bin/llama-bench
  m=$W/models/main-bf16.gguf
  log "llama-bench references"
  for fmt in md json jsonl csv; do
    "$lb" -m "$m" -ngl 99 -fa 1 -p 128 -n 128 -d 0,512 -r 3 -o $fmt >"$REC/llama-bench-d.$fmt" 2>"$REC/llama-bench-d.$fmt.err"
  done
  "$lb" -m "$m" -ngl 99 -fa 1 -p 0 -n 0 -pg 2048,128 -r 3 -o json >"$REC/llama-bench-pg.json" 2>"$REC/llama-bench-pg.err"
  "$lb" -m /nonexistent.gguf -o json >"$REC/llama-bench-missing.out" 2>"$REC/llama-bench-missing.err"; echo "exit $?" >>"$REC/llama-bench-missing.err"
  ;;
serve)
  export PYTHONPATH=$PWD:$W/llama.cpp/gguf-py
  shift
  log "service + bench: $*"
  "$@" 2>&1 | tee "$REC/serve.txt"
  ;;
*) echo "usage: gpu_engine_run.sh build|models|serve" >&2; exit 2 ;;
esac
log "done $1"
tar -C "$OUT" -czf "$OUT/rec-$1.tar.gz" rec && rm -rf "$REC"
ls -la "$OUT"
