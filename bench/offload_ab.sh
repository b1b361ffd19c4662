#!/usr/bin/env bash
# Trainers with offload services, two builds against each other: W trainer ranks of gpt2
# (stage 3, optimizer and parameters offloaded, micro-batch 2, T = 64; W = 2 and fp32 by
# default), each with its own RAM offload service on 127.0.0.1 (so payloads go through the
# shared-memory arena), run alternately with binary A and binary B on the same seed and
# data. Prints each run's wall time, the processes' peak RSS and CPU, the last loss (the
# two builds must agree), and the median of B's wall times over A's.
#   bench/offload_ab.sh OLD_DSACTOR NEW_DSACTOR [RUNS=3] [STEPS=10] [WORLD=2] [PRECISION=fp32|bf16|fp16]
# GAS=N in the environment: gradient_accumulation_steps (1 by default).
# Uses `--insecure` (loopback only, a throwaway job) and ports 5755-5757.
set -euo pipefail
A=$(realpath "$1")
B=$(realpath "$2")
RUNS=${3:-3}
STEPS=${4:-10}
WORLD=${5:-2}
GAS=${GAS:-1}
PRECISION=${6:-fp32}
case $PRECISION in
  fp32) HALF="" ;;
  bf16) HALF='"bf16": {"enabled": true},' ;;
  fp16) HALF='"fp16": {"enabled": true},' ;;
  *) echo "PRECISION: fp32, bf16 or fp16, not $PRECISION" >&2; exit 2 ;;
esac
case $WORLD in 1 | 2) ;; *) echo "WORLD: 1 or 2, not $WORLD" >&2; exit 2 ;; esac
WORK=$(mktemp -d)
trap 'pkill -f "start --role offload --listen tcp://127.0.0.1:575[56]" || true; rm -rf "$WORK"' EXIT
cat >"$WORK/ds.json" <<EOF
{
  $HALF
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": $GAS,
  "gradient_clipping": 1.0,
  "steps_per_print": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                        "offload_param": {"device": "cpu"}}
}
EOF
DATA=/usr/share/games/fortunes/art
export OMP_NUM_THREADS=1
TIME=(/usr/bin/time -f "peak_rss_kb %M cpu_s %U+%S")

one_run() {  # binary tag -> prints "wall_s last_loss"
  local bin=$1 d=$WORK/$2
  mkdir -p "$d"
  for s in $(seq 0 $((WORLD - 1))); do
    "${TIME[@]}" "$bin" start --role offload --listen "tcp://127.0.0.1:575$((5 + s))" --insecure \
      --no-mlock >"$d/service$s.log" 2>&1 &
  done
  sleep 2
  local t0 pids=()
  t0=$(date +%s.%N)
  for r in $(seq 0 $((WORLD - 1))); do
    local extra=()
    [ "$WORLD" = 2 ] && extra=(--world-size 2 --coordinator tcp://127.0.0.1:5757)
    [ "$WORLD" = 2 ] && [ "$r" = 0 ] && extra+=(--serve-coordinator)
    "${TIME[@]}" "$bin" start --role trainer --config "$WORK/ds.json" --model gpt2 --seq 64 \
      --data "$DATA" --steps "$STEPS" --rank "$r" --insecure --job "ab-$2" --name "rank$r" \
      --offload "tcp://127.0.0.1:575$((5 + r))" "${extra[@]}" >"$d/rank$r.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  local t1
  t1=$(date +%s.%N)
  pkill -f "^$bin start --role offload --listen tcp://127.0.0.1:575[56]" || true
  wait
  local loss
  loss=$(grep -o "done at step [0-9]*: loss [0-9.]*" "$d/rank0.log" | awk '{print $NF}')
  echo "$(echo "$t1 - $t0" | bc) $loss"
  for f in "$d"/*.log; do echo "  $(basename "$f" .log) $(grep peak_rss_kb "$f")"; done >&2
}

a_times=() b_times=()
for i in $(seq "$RUNS"); do
  read -r wa la < <(one_run "$A" "a$i")
  echo "A run $i: ${wa} s, loss $la"
  read -r wb lb < <(one_run "$B" "b$i")
  echo "B run $i: ${wb} s, loss $lb"
  [ "$la" = "$lb" ] || echo "the builds disagree: loss $la against $lb"
  a_times+=("$wa")
  b_times+=("$wb")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ma=$(median "${a_times[@]}")
mb=$(median "${b_times[@]}")
echo "median wall time: A $ma s, B $mb s; B over A $(echo "scale=3; $mb / $ma" | bc)"
