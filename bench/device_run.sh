#!/usr/bin/env bash
# One batched run on a lent GPU machine (the device tool): real probes, doctor, facts, the link
# stage's real load, and the two benchmarks. Everything lands in $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log=$OUT/log.txt
{
  date -u; uname -r; python3 -c 'import torch, pynvml; print("torch", torch.__version__, torch.cuda.device_count())'
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,pcie.link.gen.gpucurrent,pcie.link.width.current --format=csv
} >"$log" 2>&1
{ nvidia-smi -q; echo "== topo -m"; nvidia-smi topo -m; echo "== topo -p2p r"; nvidia-smi topo -p2p r;
  echo "== topo -p2p w"; nvidia-smi topo -p2p w; } >"$OUT/smi.txt" 2>&1
python3 -m p2pkit doctor --json >"$OUT/doctor.json" 2>>"$log"; echo "doctor exit $?" >>"$log"
python3 -m p2pkit facts record "$OUT/facts.json" 2>>"$log"; echo "facts exit $?" >>"$log"
python3 -m p2pkit --state-dir /tmp/p2pkit-state verify link --json >"$OUT/verify_link.json" 2>>"$log"
echo "verify link exit $?" >>"$log"
python3 bench/bench_doctor.py >"$OUT/bench_doctor.json" 2>>"$log"
python3 bench/bench_link.py >"$OUT/bench_link.json" 2>>"$log"
echo "done" >>"$log"; cat "$log"
