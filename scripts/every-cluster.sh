#!/usr/bin/env bash
# Each ITP trace (traces/itp) alone: 30% of jobs preemptible, 32 nodes x 8
# GPUs, 60 s save on notice, hourly checkpoints.
# Usage: scripts/every-cluster.sh   (prints a Markdown table;
# EBB=PATH replays with that ebb binary instead of building the release one)
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${EBB_TRACES:-traces/itp}
ebb=${EBB:-}
if [ -z "$ebb" ]; then
  cargo build --release -q -p ebb
  ebb=target/release/ebb
fi
echo "| trace | jobs | completed | makespan | GPU utilisation | preemptions | lost GPU-h | on-demand wait p99 | preemptible slowdown p99 | on-demand revenue | preemptible revenue |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
summarise=$(cat <<'PY'
import json, sys
s = json.load(sys.stdin)
r, wait, slow = s["revenue_usd"], s["on_demand_wait_s"], s["preemptible_slowdown"]
print(f"| {sys.argv[1]} | {s['jobs']} | {s['completed']} | {s['makespan_s'] / 3600:.0f} h | {s['gpu_utilization'] * 100:.1f}% "
      f"| {s['preemptions']} | {s['lost_gpu_hours']:.1f} | {wait['p99']:.0f} s "
      f"| {slow['p99']:.2f} | ${r['on_demand']:,.0f} | ${r['preemptible']:,.0f} |")
PY
)
for trace in "$traces"/cluster*.csv; do
  name=$(basename "$trace" .csv)
  "$ebb" sim --trace "$trace" --nodes 32 --preemptible-fraction 0.3 --drain-checkpoint 60 \
      --checkpoint-interval 1h --json - | python3 -c "$summarise" "$name"
done
