#!/usr/bin/env bash
# What elastic gangs do on the ITP traces: each trace with multi-node jobs
# replayed as the preemptible tier beside an on-demand trace of small
# jobs, on 24 nodes of 8 GPUs, rigid and with --elastic 0.5; hourly
# checkpoints, a minute to restart. First with jobs that save on notice
# (in 60 s), then with jobs killed at the deadline without a save; then
# one pair on clusters of 16 to 28 nodes.
# Usage: scripts/elastic.sh   (prints three Markdown tables; EBB=PATH
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
compare=$(cat <<'PY'
import json, sys
label = sys.argv[1]
rigid, elastic = (json.loads(line) for line in sys.stdin)
r, e = rigid["multi_node"], elastic["multi_node"]
ratio = e["slowdown"]["mean"] / r["slowdown"]["mean"]
print(f"| {label} | {r['jobs']} | {r['slowdown']['mean']:.2f} → {e['slowdown']['mean']:.2f} | {ratio:.3f} "
      f"| {r['slowdown']['p50']:.2f} → {e['slowdown']['p50']:.2f} "
      f"| {r['wait_s']['mean'] / 3600:.1f} → {e['wait_s']['mean'] / 3600:.1f} "
      f"| {rigid['gpu_utilization'] * 100:.2f}% → {elastic['gpu_utilization'] * 100:.2f}% "
      f"| {rigid['lost_gpu_hours']:.1f} → {elastic['lost_gpu_hours']:.1f} "
      f"| {r['preemptions']} → {e['preemptions']} | {e['shrinks']} / {e['grows']} |")
PY
)
pair() {
  local label=$1; shift
  { "$ebb" sim "$@" --json - | tr -d '\n'; echo
    "$ebb" sim "$@" --elastic 0.5 --json - | tr -d '\n'; echo; } | python3 -c "$compare" "$label"
}
header() {
  echo "| $1 | multi-node jobs | mean slowdown, rigid → elastic | ratio | p50 slowdown | mean wait, h | utilisation | lost GPU-h | whole preemptions | shrinks / grows |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
}
common=(--checkpoint-interval 1h --restart-overhead 60)
for saves in "--drain-checkpoint 60" ""; do
  header "preemptible + on-demand, 24 nodes"
  for pre in cluster01 cluster02 cluster03 cluster06; do
    for od in cluster08 cluster05; do
      # shellcheck disable=SC2086
      pair "$pre + $od" --nodes 24 "${common[@]}" $saves \
        --trace "preemptible=$traces/$pre.csv" --trace "on-demand=$traces/$od.csv"
    done
  done
  echo
done
header "cluster02 + cluster08, nodes"
for nodes in 16 20 24 28; do
  pair "$nodes" --nodes "$nodes" "${common[@]}" --drain-checkpoint 60 \
    --trace "preemptible=$traces/cluster02.csv" --trace "on-demand=$traces/cluster08.csv"
done
