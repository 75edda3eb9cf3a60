#!/usr/bin/env bash
# run-guarded.sh RSS_GB TIMEOUT_S LOG CMD...: runs CMD in its own process group with stdout and
# stderr appended to LOG; stops the group when its resident memory passes RSS_GB or after
# TIMEOUT_S, and appends "GUARD rc R, S s, peak RSS P GB[, KILLED: why]" to LOG.
#
# Why: compute-sanitizer's racecheck can grow past the host's memory (130 GB for an engine test in
# 2026-11; the kernel's OOM killer then also takes unrelated jobs), and a hung job must not hold a
# device call past its limit.
set -uo pipefail
rss_gb=$1 timeout_s=$2 log=$3
shift 3
start=$SECONDS
setsid "$@" >> "$log" 2>&1 &
pid=$!
trap 'kill -9 -- -"$pid" 2> /dev/null; exit 143' TERM INT
peak=0 why=""
while kill -0 "$pid" 2> /dev/null; do
  rss=$(ps -o rss= -g "$pid" 2> /dev/null | awk '{s += $1} END {print int(s / 1048576)}')
  rss=${rss:-0}
  [ "$rss" -gt "$peak" ] && peak=$rss
  if [ "$rss" -ge "$rss_gb" ]; then why="host memory over $rss_gb GB"; fi
  if [ $((SECONDS - start)) -ge "$timeout_s" ]; then why="over $timeout_s s"; fi
  if [ -n "$why" ]; then
    kill -9 -- -"$pid" 2> /dev/null
    break
  fi
  sleep 1
done
{ wait "$pid"; } 2> /dev/null
rc=$?
echo "GUARD rc $rc, $((SECONDS - start)) s, peak RSS $peak GB${why:+, KILLED: $why}" >> "$log"
exit $rc
