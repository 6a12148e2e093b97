#!/usr/bin/env bash
# The fleet-pods experiment on the GPU machine, from the staged bundle to fleet_pods.json:
# unpack, tune once (cold), then two pairs of every pod setup (scripts/gpu_fleet_pods.py).
# Started under setsid by the command that carries the bundle's last part, so that it runs on
# across back-to-back commands; each command waits on it with `gpu_fleet_pods.sh wait SECONDS`,
# which then packs what exists so far into $OUT.
#   scripts/gpu_fleet_pods.sh start      # join and unpack /tmp/stage, start the experiment
#   scripts/gpu_fleet_pods.sh wait 560   # wait up to 560 s for it, then tar the results into $OUT
# PAIRS (default "1 2"): the pairs to boot; SETUPS (default: every setup of gpu_fleet_pods.py):
# the pod setups, comma-separated, e.g. PAIRS="1 2 3 4 5" SETUPS=same_as_tuner,non_root_user
# for more pairs of a few setups within one GPU session.
set -uo pipefail
exp=/tmp/fleet-exp
case "${1:-}" in
  start)
    mkdir -p "$exp/out"
    cat /tmp/stage/site.tar.xz.parta? > /tmp/stage/site.tar.xz && sha256sum /tmp/stage/site.tar.xz > "$exp/out/sha256.txt"
    mkdir -p /tmp/site && xz -T0 -dc /tmp/stage/site.tar.xz | tar -C /tmp/site -x
    rm -rf /tmp/site/tunecache /tmp/site/tunecache_*.dist-info && tar -C /tmp/site -xJf /tmp/stage/tunecache-site.tar.xz
    rm -f /tmp/stage/site.tar.xz
    setups=${SETUPS:+--setups $SETUPS}
    export PYTHONPATH=/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
    setsid bash -c "
      python3 scripts/gpu_fleet_pods.py tune --out $exp/out --boot-timeout 330 $setups > $exp/out/tune.out 2>&1
      for pair in ${PAIRS:-1 2}; do
        python3 scripts/gpu_fleet_pods.py pods --out $exp/out --pair \$pair --boot-timeout 200 $setups >> $exp/out/pods.out 2>&1
      done
      touch $exp/done" < /dev/null > "$exp/out/driver.out" 2>&1 &
    echo started ;;
  wait)
    limit=${2:-560}
    for _ in $(seq "$limit"); do [ -e "$exp/done" ] && break; sleep 1; done
    [ -e "$exp/done" ] && echo "experiment done" || echo "experiment still running"
    cat "$exp/out/pods.out" 2>/dev/null | grep '^{' ; tail -3 "$exp/out/tune.out" 2>/dev/null
    tar -C "$exp" -czf "$OUT/fleet-out.tar.gz" out ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
