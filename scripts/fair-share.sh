#!/usr/bin/env bash
# Fair share against FIFO on the ITP traces, one trace a tenant, with
# preemptible backlogs on clusters too small for them: a small tenant
# beside a big one, two equal and unequal tenants, four tenants, on-demand
# work beside them, and fair-share preemption with jobs that save in the
# window. Each scenario is replayed in FIFO order (as before fair share)
# and in fair-share order.
# Usage: scripts/fair-share.sh   (prints a Markdown table; EBB=PATH
# replays with that ebb binary instead of building the release one: a
# replay's figures do not depend on the build)
set -euo pipefail
cd "$(dirname "$0")/.."
t=${EBB_TRACES:-traces/itp}
ebb=${EBB:-}
if [ -z "$ebb" ]; then
  cargo build --release -q -p ebb
  ebb=target/release/ebb
fi
summarise=$(cat <<'PY'
import json, sys
s = json.load(sys.stdin)
name, order = sys.argv[1], sys.argv[2]
w = s.get("window") or {}
util = f"{s['gpu_utilization'] * 100:.2f}%"
if w:
    util += f" ({w['gpu_utilization'] * 100:.2f}% to --until)"
revenue = sum(s["revenue_usd"].values())
od = s["on_demand_wait_s"]
tenants = "; ".join(
    f"{n} w{t['weight']}: {t['share'] * 100:.1f}%, wait p50 {t['wait_s']['p50'] / 3600:.1f} h p99 {t['wait_s']['p99'] / 3600:.0f} h"
    + (f", {t['preemptions']} preempted, lost {t['lost_gpu_hours']:.1f} GPU-h" if t["preemptions"] else "")
    for n, t in s["tenants"].items()
)
jain = "–" if s["jain_index"] is None else f"{s['jain_index']:.4f} ({s['busy_hours']} h)"
print(f"| {name} | {order} | {tenants} | {jain} | {util} | ${revenue:,.2f} | {od['p50']:.0f} s / {od['p99']:.0f} s |")
PY
)
echo "| scenario | order | per tenant: share of GPU-hours, wait p50 / p99 | Jain's index (busy hours) | utilisation | revenue | on-demand wait p50 / p99 |"
echo "|---|---|---|---|---|---|---|"
run() {
  local name=$1
  shift
  for order in fifo fair-share; do
    "$ebb" sim --order "$order" "$@" --json - | python3 -c "$summarise" "$name" "$order"
  done
}
run "a small tenant beside a big one, 4 nodes" --nodes 4 \
  --tenant "a=$t/cluster08.csv:1:preemptible" --tenant "b=$t/cluster10.csv:1:preemptible"
run "two equal, 4 nodes" --nodes 4 \
  --tenant "a=$t/cluster08.csv:1:preemptible" --tenant "b=$t/cluster09.csv:1:preemptible"
run "two at 2:1, 4 nodes" --nodes 4 \
  --tenant "a=$t/cluster08.csv:2:preemptible" --tenant "b=$t/cluster09.csv:1:preemptible"
run "four at 1:1:2:1, 6 nodes" --nodes 6 \
  --tenant "a=$t/cluster08.csv:1:preemptible" --tenant "b=$t/cluster09.csv:1:preemptible" \
  --tenant "c=$t/cluster02.csv:2:preemptible" --tenant "d=$t/cluster10.csv:1:preemptible"
run "two equal, first 60 days, 4 nodes" --nodes 4 --until 5184000 \
  --tenant "a=$t/cluster08.csv:1:preemptible" --tenant "b=$t/cluster09.csv:1:preemptible"
run "four, first 60 days, 6 nodes" --nodes 6 --until 5184000 \
  --tenant "a=$t/cluster08.csv:1:preemptible" --tenant "b=$t/cluster09.csv:1:preemptible" \
  --tenant "c=$t/cluster02.csv:2:preemptible" --tenant "d=$t/cluster10.csv:1:preemptible"
run "on-demand beside two, 8 nodes" --nodes 8 --trace "on-demand=$t/cluster10.csv" \
  --tenant "a=$t/cluster08.csv:1:preemptible" --tenant "b=$t/cluster09.csv:1:preemptible"
run "fair-share preemption, saves in 60 s, 4 nodes" --nodes 4 --fair-share-preemption \
  --checkpoint-interval 1h --drain-checkpoint 60 \
  --tenant "a=$t/cluster08.csv:1:preemptible" --tenant "b=$t/cluster10.csv:1:preemptible"
