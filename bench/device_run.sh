#!/usr/bin/env bash
# One batched run on a lent GPU machine (the device tool): real probes, doctor (every pitfall check,
# the field ones included), facts, the link stage's real load, NCCL's all-reduce through p2pkit's
# ctypes path, and the doctor benchmark. Everything lands in $OUT (at most 8 files come back).
# On a one-GPU machine the profile's GPU keys are overridden to what is there.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log=$OUT/log.txt
n=$(nvidia-smi -L | wc -l)
set_args=()
if [ "$n" -lt 2 ]; then
  set_args=(--set gpus.count=1 --set "gpus.model=NVIDIA H200" --set gpus.vram_gib=140 --set pcie.min_gen=5
            --set pcie.min_width=16)
fi
{
  date -u; uname -r; echo "gpus: $n"
  python3 -c 'import torch, pynvml; print("torch", torch.__version__, torch.cuda.device_count())'
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,pcie.link.gen.gpucurrent,pcie.link.width.current --format=csv
} >"$log" 2>&1
python3 -m p2pkit "${set_args[@]}" --state-dir /tmp/p2pkit-state doctor --json >"$OUT/doctor.json" 2>>"$log"
echo "doctor exit $?" >>"$log"
python3 -m p2pkit "${set_args[@]}" facts record "$OUT/facts.json" 2>>"$log"; echo "facts exit $?" >>"$log"
python3 -m p2pkit "${set_args[@]}" --state-dir /tmp/p2pkit-state verify link --json >"$OUT/verify_link.json" 2>>"$log"
echo "verify link exit $?" >>"$log"
# the all-reduce the link stage runs across a pair, here over every GPU there is (1 proves the bindings)
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib/libnccl.so.2"))')
NCCL_DEBUG=INFO NCCL_NVLS_ENABLE=0 timeout 120 python3 -m p2pkit.load.nccl_allreduce \
  "{\"lib\": \"$nccl\", \"gpus\": $n}" >"$OUT/nccl_allreduce.txt" 2>&1
echo "nccl all-reduce exit $? ($nccl)" >>"$log"
python3 bench/bench_doctor.py >"$OUT/bench_doctor.json" 2>>"$log"; echo "bench_doctor exit $?" >>"$log"
echo "done" >>"$log"; cat "$log"; tail -3 "$OUT/nccl_allreduce.txt"
