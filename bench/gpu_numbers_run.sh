#!/usr/bin/env bash
# Issue 38 on a lent GPU machine (the device tool), one call each, after gpu_engine_run.sh's build and models
# (the conversion beside the build; its functions are sourced from there):
#   bash bench/gpu_numbers_run.sh probe    where served decode loses against llama-bench (bench/gpu_decode_probe.py:
#                                          the profile's flags, then one thing changed at a time; the first-request
#                                          stall with trace logging), then p2pkit's bench by the seed's method with
#                                          llama-bench and llama-batched-bench as references, a /metrics pair across
#                                          a restart, llama-batched-bench's own formats and errors
#   bash bench/gpu_numbers_run.sh final    p2pkit's bench with the profile as it is now, a restart in the middle of a
#                                          level, drafting read from three sources, and the bench scripts (doctor
#                                          against nvidia-smi -q, --help/--version against the interpreter, link,
#                                          hash) beside it
#   bash bench/gpu_numbers_run.sh sizes    where the last percent of served decode goes, by model size: the 0.76B
#                                          main model and a 5.7B one (bench/gpu_model.py large, converted to f16 by
#                                          llama.cpp's converter beside the build), each served with the profile's
#                                          flags and a few variants, 10 timed requests a shape, against llama-bench tg
#                                          (10 repetitions): a fixed cost a step shows as the same milliseconds a
#                                          token at both sizes; then the production shape at 4 and 8 streams with 3
#                                          and 8 requests a stream (the drain at a level's end), and doctor's bench
# Every phase tars its records into $OUT/rec-PHASE.tar.gz when it ends (at most 8 files come back), and a phase
# that would run past the call's 600 s is left out and says so.
set -u
T0=$(date +%s)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/gpu_engine_run.sh
. "$HERE/gpu_engine_run.sh"
BUDGET=${BUDGET:-575}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
room() {  # room NEEDED_S WHAT: whether the call has NEEDED_S left; says so when it has not
  if [ "$(left)" -lt "$1" ]; then log "left out ($(left) s left, $1 s needed): $2"; return 1; fi
}
P=(python3 -m p2pkit --profile "$PROFILE" "${SETS[@]}" --state-dir "$W/state")
ident() { python3 - <<'PY'
import json
from p2pkit.host import Host, system
from p2pkit.stages.service import launcher
r = launcher.record(Host.at("/")) or {}
pid = r.get("pid")
print(json.dumps({"pid": pid, "start_ticks": system.process_start(Host.at("/"), pid) if pid else None}))
PY
}

build_and_models() {
  phase_build & local bpid=$!
  for _ in $(seq 120); do [ -f "$W/llama.cpp/convert_hf_to_gguf.py" ] && break; sleep 1; done
  phase_models
  wait "$bpid"
}

service_up() {  # the service stage as the profile says (the launcher: no systemd there)
  { ls -l /dev/nvidia* ; getent group video render; } >"$REC/devices.txt" 2>&1
  for g in video render; do getent group $g >/dev/null || groupadd -r $g; done
  for d in /dev/nvidia*; do [ -c "$d" ] || continue
    perm=$(stat -c %a "$d"); case "$perm" in *6) ;; *) chgrp video "$d" && chmod g+rw "$d";; esac
  done
  stages --state-dir "$W/state" service 2>&1 | tee "$REC/service-stage.txt" | tail -3
  cp "$W/state/service.json" "$REC/service.artifact.json"
}

phase_probe() {
  begin probe
  service_up
  get "http://127.0.0.1:18080/props" >"$REC/props.json" 2>&1
  room 90 "the decode probe" && {
    log "decode probe: the profile's flags, then one thing changed at a time; the stall"
    python3 bench/gpu_decode_probe.py --profile "$PROFILE" "${SETS[@]}" --state-dir "$W/state-probe" --requests 3 \
      --reps 5 --stall --out "$REC/probe.json" --log-dir "$REC/probe-logs" 2>&1 | tee "$REC/probe.txt"; }
  room 80 "p2pkit bench (seed's method, references)" && {
    log "bench: two shapes x 1,2,4,8 streams, llama-bench and llama-batched-bench references"
    python3 bench/gpu_bench.py --profile "$PROFILE" "${SETS[@]}" --state-dir "$W/state" --shapes decode,production \
      --concurrency 1,2,4,8 --requests 3 --warmup 1 --reference --out "$REC/bench.json" --plot "$OUT/bench-probe.png" \
      2>&1 | tee "$REC/bench.txt"; }
  room 20 "the /metrics pair across a restart" && restart_pair
  room 30 "llama-batched-bench's formats" && batched_formats
  cp "$W"/state/logs/engine-launcher.log "$REC/" 2>/dev/null
  "${P[@]}" serve stop >"$REC/serve-stop.txt" 2>&1
  room 60 "the bench scripts" && scripts
  end probe
}

restart_pair() {  # /metrics read, the engine restarted, /metrics read again: the real pair across a restart
  get "http://127.0.0.1:18080/metrics" >"$REC/metrics-before-restart.txt" 2>&1
  ident >"$REC/engine-before-restart.json" 2>&1
  "${P[@]}" serve restart >"$REC/serve-restart.txt" 2>&1; echo "restart exit $?" >>"$REC/serve-restart.txt"
  get "http://127.0.0.1:18080/metrics" >"$REC/metrics-after-restart.txt" 2>&1
  ident >"$REC/engine-after-restart.json" 2>&1
}

batched_formats() {  # llama-batched-bench's table, JSONL and errors from the CUDA build, for the package's reader
  local bb=$W/llama.cpp/build/bin/llama-batched-bench m=$W/models/main-bf16.gguf d=$REC/batched
  mkdir -p "$d"
  "$bb" -m "$m" -ngl 99 -fa on -c 4096 -npp 128 -ntg 32 -npl 1,2 >"$d/md.txt" 2>"$d/md.stderr.txt"; echo "exit $?" >>"$d/md.stderr.txt"
  "$bb" -m "$m" -ngl 99 -fa on -c 4096 -npp 128 -ntg 32 -npl 1,2 --output-format jsonl >"$d/jsonl.txt" 2>"$d/jsonl.stderr.txt"
  echo "exit $?" >>"$d/jsonl.stderr.txt"
  "$bb" -m "$m" -ngl 99 -fa on -c 512 -npp 128 -ntg 32 -npl 1,2,4 >"$d/too-small-c.txt" 2>"$d/too-small-c.stderr.txt"
  echo "exit $?" >>"$d/too-small-c.stderr.txt"
  "$bb" -m "$W/models/missing.gguf" -npp 128 -ntg 32 -npl 1 >"$d/missing-model.txt" 2>"$d/missing-model.stderr.txt"
  echo "exit $?" >>"$d/missing-model.stderr.txt"
}

large_model() {  # the 5.7B checkpoint made and converted beside the build (needs the unpacked source only)
  python3 bench/gpu_model.py large "$W/src/large" | tee "$REC/model-large.json"
  local t0; t0=$(date +%s)
  python3 "$W/llama.cpp/convert_hf_to_gguf.py" "$W/src/large" --outfile "$W/models/large-f16.gguf" --outtype f16 \
    >"$REC/convert-large.txt" 2>&1; echo "exit $?" >>"$REC/convert-large.txt"
  log "large model converted in $(( $(date +%s) - t0 )) s"
  rm -rf "$W/src/large"
}

phase_sizes() {
  begin sizes
  phase_build & local bpid=$!
  for _ in $(seq 120); do [ -f "$W/llama.cpp/convert_hf_to_gguf.py" ] && break; sleep 1; done
  REC=$OUT/sizes; mkdir -p "$W/models"
  large_model
  python3 bench/gpu_model.py main "$W/src/main" >"$REC/model-main.json"
  stages --state-dir "$W/state-model" model >"$REC/model-stage-main.txt" 2>&1
  wait "$bpid"; REC=$OUT/sizes
  local v=p2pkit,greedy-sampler,backend-sampling,threads-1
  room 150 "the decode probe, 5.7B" && {
    log "decode probe, 5.7B model: $v, 10 requests a shape"
    python3 bench/gpu_decode_probe.py --profile "$PROFILE" "${SETS[@]}" --set "model.output=$W/models/large-f16.gguf" \
      --state-dir "$W/state-probe" --requests 10 --reps 10 --variants "$v" --out "$REC/probe-large.json" \
      --log-dir "$REC/probe-large-logs" 2>&1 | tee "$REC/probe-large.txt"; }
  room 100 "the decode probe, 0.76B" && {
    log "decode probe, 0.76B model: $v, 10 requests a shape"
    python3 bench/gpu_decode_probe.py --profile "$PROFILE" "${SETS[@]}" --state-dir "$W/state-probe" --requests 10 \
      --reps 10 --variants "$v" --out "$REC/probe-main.json" --log-dir "$REC/probe-main-logs" 2>&1 | tee "$REC/probe-main.txt"; }
  room 90 "production at 4 and 8 streams" && {
    service_up
    log "bench: production at 4 and 8 streams, 3 requests a stream, llama-batched-bench reference"
    python3 bench/gpu_bench.py --profile "$PROFILE" "${SETS[@]}" --state-dir "$W/state" --shapes production \
      --concurrency 4,8 --requests 3 --warmup 1 --reference --out "$REC/bench-prod-3.json" 2>&1 | tee "$REC/bench-prod-3.txt"
    room 40 "production with 8 requests a stream" && {
      log "bench: production at 4 and 8 streams, 8 requests a stream"
      python3 bench/gpu_bench.py --profile "$PROFILE" "${SETS[@]}" --state-dir "$W/state" --shapes production \
        --concurrency 4,8 --requests 8 --warmup 1 --out "$REC/bench-prod-8.json" 2>&1 | tee "$REC/bench-prod-8.txt"; }
    cp "$W"/state/logs/engine-launcher.log "$REC/" 2>/dev/null
    "${P[@]}" serve stop >"$REC/serve-stop.txt" 2>&1; }
  room 30 "doctor's bench" && {
    unset PYTHONDONTWRITEBYTECODE
    python3 -m compileall -q p2pkit bench /tmp/site >/dev/null 2>&1
    python3 -m venv --without-pip /tmp/v && PYTHONPATH=/tmp/site /tmp/v/bin/python3 bench/bench_doctor.py --runs 9 \
      >"$REC/bench_doctor_venv.json" 2>"$REC/bench_doctor_venv.err"
    PYTHONPATH=/tmp/site /tmp/v/bin/python3 bench/doctor_timeline.py --runs 3 >"$REC/doctor_timeline.jsonl" \
      2>"$REC/doctor_timeline.err"; }
  end sizes
}

phase_final() {
  begin final
  service_up
  room 100 "p2pkit bench (seed's method, references)" && {
    log "bench: the profile as it is now"
    python3 bench/gpu_bench.py --profile "$PROFILE" "${SETS[@]}" --state-dir "$W/state" --shapes decode,production \
      --concurrency 1,2,4,8 --requests 3 --warmup 1 --reference --out "$REC/bench.json" --plot "$OUT/bench.png" \
      2>&1 | tee "$REC/bench.txt"; }
  room 40 "a restart in the middle of a level" && {
    log "bench with the engine restarted in the middle of its level"
    python3 bench/gpu_bench.py --profile "$PROFILE" "${SETS[@]}" --state-dir "$W/state" --shapes decode \
      --concurrency 1 --requests 8 --warmup 1 --out "$REC/bench-restart.json" >"$REC/bench-restart.txt" 2>&1 &
    local bp=$!
    sleep 4; "${P[@]}" serve restart >"$REC/serve-restart-mid.txt" 2>&1; wait "$bp"; echo "bench exit $?" >>"$REC/bench-restart.txt"; }
  room 45 "drafting from three sources" && {
    log "drafting on: the log's lines, /metrics and the responses"
    python3 bench/gpu_bench.py --profile "$PROFILE" "${SETS[@]}" --set serve.flags.model-draft="$W/models/draft-bf16.gguf" \
      --set serve.flags.spec-type=none --state-dir "$W/state" --shapes decode --concurrency 1,2 --requests 2 --warmup 1 \
      --ab serve.flags.spec-type=draft-simple --out "$REC/bench-draft.json" >"$REC/bench-draft.txt" 2>&1
    echo "exit $?" >>"$REC/bench-draft.txt"; }
  cp "$W"/state/logs/engine-launcher.log "$REC/" 2>/dev/null
  "${P[@]}" serve stop >"$REC/serve-stop.txt" 2>&1
  room 60 "the bench scripts" && scripts
  end final
}

scripts() {  # the bench scripts, each as `python3 bench/NAME.py` from this checkout (no install)
  unset PYTHONDONTWRITEBYTECODE
  python3 -m compileall -q p2pkit bench /tmp/site >/dev/null 2>&1
  python3 bench/bench_doctor.py --runs 9 >"$REC/bench_doctor.json" 2>"$REC/bench_doctor.err"
  # the same in a virtual environment holding the locked dependencies only (how a user installs p2pkit):
  # no system site-packages, so not that image's numba .pth hook
  python3 -m venv --without-pip /tmp/v && PYTHONPATH=/tmp/site /tmp/v/bin/python3 bench/bench_doctor.py --runs 9 \
    >"$REC/bench_doctor_venv.json" 2>"$REC/bench_doctor_venv.err"
  python3 bench/bench_link.py >"$REC/bench_link.json" 2>"$REC/bench_link.err"
  python3 bench/bench_hash.py --mib 1024 --runs 3 >"$REC/bench_hash.json" 2>"$REC/bench_hash.err"
}

case "${1:-}" in
probe) build_and_models; phase_probe ;;
final) build_and_models; phase_final ;;
sizes) phase_sizes ;;
*) echo "usage: gpu_numbers_run.sh probe|final|sizes" >&2; exit 2 ;;
esac
log "call took $(( $(date +%s) - T0 )) s"
ls -la "$OUT"
