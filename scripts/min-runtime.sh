#!/usr/bin/env bash
# What --min-runtime does to thrash: cluster08 with half its jobs
# preemptible on 12 nodes (often full), hourly checkpoints; the rule off
# and at several settings, with victims that save on notice and with
# victims killed at once; then 0 against 5m on clusters of 10 to 14 nodes.
# Usage: scripts/min-runtime.sh   (prints three Markdown tables; EBB=PATH
# replays with that ebb binary instead of building the release one: a
# replay's figures do not depend on the build)
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${EBB_TRACES:-traces/itp}
ebb=${EBB:-}
if [ -z "$ebb" ]; then
  cargo build --release -q -p ebb
  ebb=target/release/ebb
fi
common=(--trace "$traces/cluster08.csv" --preemptible-fraction 0.5 --checkpoint-interval 1h)
summarise=$(cat <<'PY'
import json, sys
s = json.load(sys.stdin)
q, slow = s["on_demand_wait_s"], s["preemptible_slowdown"]
label, shape = sys.argv[1], sys.argv[2]
wait = f"{q['mean']:.1f} s | {q['p50']:.0f} s / {q['p99']:.0f} s / {q['max']:.0f} s"
if shape == "saves":
    print(f"| {label} | {s['preemptions']} | {s['jobs_preempted']} ({s['jobs_preempted_repeatedly']}) | {s['repeat_preemptions']} "
          f"| {s['quick_repeat_preemptions']} | {s['max_preemptions_of_a_job']} | {s['drain_gpu_hours']:.1f} "
          f"| {wait} | {slow['p99']:.1f} |")
elif shape == "killed":
    print(f"| {label} | {s['preemptions']} | {s['repeat_preemptions']} | {s['quick_repeat_preemptions']} "
          f"| {s['lost_gpu_hours']:.1f} | {wait} |")
else:
    print(f"| {label} | {s['preemptions']} | {s['repeat_preemptions']} | {s['quick_repeat_preemptions']} | {wait} |")
PY
)
row() {
  local label=$1 shape=$2; shift 2
  "$ebb" sim "${common[@]}" "$@" --json - | python3 -c "$summarise" "$label" "$shape"
}
echo "| --min-runtime | preemptions | jobs preempted (more than once) | repeat preemptions | of them within 10 min of resuming | most preemptions of one job | drain GPU-h | on-demand wait mean | p50 / p99 / max | preemptible slowdown p99 |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for min in 0 1m 2m 5m 10m 20m; do
  row "$min" saves --nodes 12 --drain-checkpoint 60 --min-runtime "$min"
done
echo
echo "| --min-runtime (killed at once) | preemptions | repeat preemptions | of them within 10 min of resuming | lost GPU-h | on-demand wait mean | p50 / p99 / max |"
echo "|---|---|---|---|---|---|---|"
for min in 0 2m 5m 10m; do
  row "$min" killed --nodes 12 --notice none --min-runtime "$min"
done
echo
echo "| nodes, --min-runtime | preemptions | repeat preemptions | of them within 10 min of resuming | on-demand wait mean | p50 / p99 / max |"
echo "|---|---|---|---|---|---|"
for nodes in 10 11 12 13 14; do
  for min in 0 5m; do
    row "$nodes, $min" sizes --nodes "$nodes" --drain-checkpoint 60 --min-runtime "$min"
  done
done
