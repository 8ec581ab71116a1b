# Sourced by scripts/cluster.sh and scripts/gang.sh: stop_pidfile DIR NAME stops the process
# DIR/NAME.pid names (SIGTERM, up to 5 s, then SIGKILL), if it still runs NAME (its command
# line holds NAME, or NAME with '_' for its first '-': local_node.py), and removes the file.
stop_pidfile() {
  local dir=$1 name=$2 pid
  [ -f "$dir/$name.pid" ] || return 0
  pid=$(cat "$dir/$name.pid")
  if kill -0 "$pid" 2>/dev/null && grep -q "${name/-/_}\|$name" "/proc/$pid/cmdline" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/$name.pid"
}
