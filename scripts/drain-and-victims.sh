#!/usr/bin/env bash
# What the drain window and the victim policy are worth, on cluster08 with
# half its jobs preemptible on 12 nodes (often full), hourly checkpoints.
# Usage: scripts/drain-and-victims.sh   (prints two Markdown tables; EBB=PATH
# replays with that ebb binary instead of building the release one)
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${EBB_TRACES:-traces/itp}
ebb=${EBB:-}
if [ -z "$ebb" ]; then
  cargo build --release -q -p ebb
  ebb=target/release/ebb
fi
common=(--trace "$traces/cluster08.csv" --nodes 12 --preemptible-fraction 0.5 --checkpoint-interval 1h)
summarise=$(cat <<'PY'
import json, sys
s = json.load(sys.stdin)
q = s["on_demand_wait_s"]
print(f"| {sys.argv[1]} | {s['preemptions']} | {s['lost_gpu_hours']:.1f} | {s['drain_gpu_hours']:.1f} "
      f"| {q['p50']:.0f} s / {q['p99']:.0f} s |")
PY
)
row() {
  local label=$1; shift
  "$ebb" sim "${common[@]}" "$@" --json - | python3 -c "$summarise" "$label"
}
echo "| notice | preemptions | lost GPU-h | drain GPU-h | on-demand wait p50 / p99 |"
echo "|---|---|---|---|---|"
row "drain, saves in 60 s (fits the 300 s window)" --notice drain --drain-checkpoint 60
row "drain, saves in 600 s (does not fit)" --notice drain --drain-checkpoint 600
row "drain, does not save on notice" --notice drain
row "none (killed at once)" --notice none
echo
echo "| victim policy (notice none) | preemptions | lost GPU-h | drain GPU-h | on-demand wait p50 / p99 |"
echo "|---|---|---|---|---|"
for policy in lost-work youngest oldest fewest-gpus random:1 random:2 random:3; do
  row "$policy" --notice none --victim-policy "$policy"
done
