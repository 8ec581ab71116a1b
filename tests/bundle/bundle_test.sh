#!/usr/bin/env bash
# The agent bundle runs on its own: copied to a fresh directory outside the build tree,
# with the system's libraries out of its reach, it prints its help, plans a Python job
# with the start-up shim it carries, and runs a two-node job whose ranks (a static probe)
# record the environment the agent gave them.
#
#   bundle_test.sh --bundle DIR --agent UNBUNDLED_AGENT --probe ENV_PROBE [--mode MODE]
#
# MODE auto (default): "hidden" when this process may create a mount namespace (root or
# CAP_SYS_ADMIN), else "ld-debug". hidden: in a private mount namespace (unshare --mount)
# an empty tmpfs covers every system library directory (/usr/lib, /usr/lib64,
# /usr/local/lib and /lib, /lib64 when they are not symlinks into /usr), so any library
# the bundle lacks fails to load; the unbundled agent must fail there (proof the hiding
# works). ld-debug: nothing is hidden; LD_DEBUG=libs must show every object the bundled
# agent initialises coming from the bundle, and the unbundled agent's from elsewhere.
set -uo pipefail

bundle="" agent="" probe="" mode=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --agent) agent=$2; shift 2 ;;
    --probe) probe=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    *) echo "bundle_test: unknown argument $1" >&2; exit 2 ;;
  esac
done

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
pass() { echo "ok: $*"; }
show() {  # show <file>: indented, for failure context
  sed 's/^/    | /' "$1" 2>/dev/null | head -n 40
}

for f in "$bundle/bin/spawnpoint-agent" "$agent" "$probe"; do
  if [ ! -x "$f" ]; then
    echo "bundle_test: $f does not exist or is not executable (build the agent-bundle target)"
    exit 1
  fi
done

work=$(mktemp -d /tmp/spawnpoint-bundle-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/spawnpoint  # as in the trainer pod, where the init container copied it
# What the operator's init container does (operator/reconciler/children.cc): the agent
# image's user (uid 65532) copies /opt/spawnpoint into an emptyDir that belongs to root.
mkdir -m 0777 "$prefix"
chmod 0755 "$work"
install_cmd=(cp -R "$bundle/." "$prefix/")
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  install_cmd=(setpriv --reuid=65532 --regid=65532 --clear-groups "${install_cmd[@]}")
  echo "install: as uid 65532, like the agent image's init container"
fi
if ! "${install_cmd[@]}" 2>"$work/install.err"; then
  echo "FAIL: the init container's copy failed:"; show "$work/install.err"; exit 1
fi
cp "$probe" "$work/env_probe"
mkdir "$work/out"
case "$(realpath "$prefix")/" in
  "$(realpath "$bundle")"/* | "$(realpath "$(dirname "$agent")/..")"/*)
    echo "bundle_test: $prefix is inside the build tree"; exit 1 ;;
esac
echo "bundle copied to $prefix"

: >"$work/train.py"  # plan checks that the script it would run exists
cat >"$work/plan.yaml" <<'EOF'
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata:
  name: bundle-plan
spec:
  nodes: 1
  gpusPerNode: 0
  procsPerNode: 1
  template:
    spec:
      containers:
        - name: trainer
          image: python:3
          command: [python3, train.py]
EOF
cat >"$work/run.yaml" <<EOF
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata:
  name: bundle-run
spec:
  nodes: 2
  gpusPerNode: 0
  procsPerNode: 1
  template:
    spec:
      containers:
        - name: trainer
          image: scratch
          command: [$work/env_probe, $work/out/env]
  loader:
    workersPerRank: 0
  restartPolicy:
    maxRestarts: 0
EOF

# Every agent command the test runs, as one script so the hidden mode can run it after
# hiding the libraries. Only bash builtins, static programs and the bundle run in it.
# $1: work dir, $2: bundle prefix, $3: unbundled agent, $4: LD_DEBUG value ("" for none)
cat >"$work/commands.sh" <<'EOF'
work=$1 prefix=$2 agent=$3 debug=$4
cd "$work"
unset PYTHONPATH SPAWNPOINT_PYTHON_SHIM_DIR  # plan must find the shim on its own
run() {  # run NAME COMMAND...: stdout/stderr/exit status to $work/NAME.{out,err,rc}
  local name=$1
  shift
  "$@" >"$work/$name.out" 2>"$work/$name.err"
  echo $? >"$work/$name.rc"
}
[ -e /lib/x86_64-linux-gnu/libc.so.6 ] && echo visible >"$work/libc.visible"
run unbundled "$agent" --help
run unbundled-via-bundle-ldso "$prefix/lib/ld-linux-x86-64.so.2" "$agent" --help
if [ -n "$debug" ]; then
  run unbundled-debug env LD_DEBUG="$debug" "$agent" version
  export LD_DEBUG=$debug
fi
run help "$prefix/bin/spawnpoint-agent" --help
run plan "$prefix/bin/spawnpoint-agent" plan -f plan.yaml --gpu-backend none
unset LD_DEBUG
LD_LIBRARY_PATH=/opt/user-libs run run "$prefix/bin/spawnpoint-agent" run -f run.yaml \
  --gpu-backend none --metrics-addr off --master-port 0 --termination-log "$work/termination-log" \
  --status-interval 60
exit 0
EOF

hidden_dirs=()
for d in /usr/lib /usr/lib64 /usr/local/lib /lib /lib64; do
  [ -d "$d" ] || continue
  real=$(realpath "$d")
  case " ${hidden_dirs[*]-} " in *" $real "*) continue ;; esac
  hidden_dirs+=("$real")
done

can_hide() {
  unshare --mount --propagation private mount -t tmpfs spawnpoint-probe "$work/out" 2>/dev/null
}
if [ "$mode" = auto ]; then
  if can_hide; then mode=hidden; else mode=ld-debug; fi
fi

case "$mode" in
  hidden)
    echo "mode: hidden (unshare --mount; empty tmpfs over ${hidden_dirs[*]})"
    # One mount(8) process mounts them all: the first tmpfs hides mount's own libraries.
    : >"$work/hide.fstab"
    for d in "${hidden_dirs[@]}"; do
      echo "spawnpoint-hidden $d tmpfs size=64k,mode=0755 0 0" >>"$work/hide.fstab"
    done
    unshare --mount --propagation private bash -c '
      mount --all --fstab "$1" || exit 3
      shift
      . "$@"' hide "$work/hide.fstab" "$work/commands.sh" "$work" "$prefix" "$agent" ""
    rc=$?
    if [ $rc -ne 0 ]; then
      echo "bundle_test: hiding the libraries failed (exit $rc)"
      exit 1
    fi
    if [ -e "$work/libc.visible" ]; then
      fail "libc.so.6 is still visible in the namespace"
    else
      pass "the system libraries are hidden"
    fi
    # The negative: the same environment stops the agent that is not bundled.
    if [ "$(cat "$work/unbundled.rc")" -ne 0 ]; then
      pass "the unbundled agent cannot start (exit $(cat "$work/unbundled.rc"))"
    else
      fail "the unbundled agent started although the libraries are hidden"
    fi
    if grep -q "cannot open shared object file" "$work/unbundled-via-bundle-ldso.err"; then
      pass "the unbundled agent finds no libraries: $(head -n 1 "$work/unbundled-via-bundle-ldso.err")"
    else
      fail "the unbundled agent, run by the bundle's ld.so, did not miss its libraries"
      show "$work/unbundled-via-bundle-ldso.err"
    fi
    ;;
  ld-debug)
    echo "mode: ld-debug (no mount namespace here: the libraries stay visible; LD_DEBUG=libs shows where each came from)"
    bash "$work/commands.sh" "$work" "$prefix" "$agent" libs
    outside=$(grep "calling init:" "$work/help.err" | grep -v "calling init: $prefix/lib/")
    if grep -q "calling init: $prefix/lib/libc.so.6" "$work/help.err" && [ -z "$outside" ]; then
      pass "every object the bundled agent loaded is from $prefix/lib"
    else
      fail "the bundled agent loaded objects from outside the bundle"
      echo "$outside" | sed 's/^/    | /'
    fi
    # The negative: the check tells the two apart.
    if grep "calling init:" "$work/unbundled-debug.err" | grep -qv "$prefix/lib/"; then
      pass "the unbundled agent loads its libraries from the system (the check discriminates)"
    else
      fail "LD_DEBUG shows no system library for the unbundled agent"
    fi
    ;;
  *)
    echo "bundle_test: unknown mode $mode"
    exit 2
    ;;
esac

# help
if [ "$(cat "$work/help.rc")" -eq 0 ] && grep -q "usage: spawnpoint-agent" "$work/help.out"; then
  pass "bundle bin/spawnpoint-agent --help"
else
  fail "bundle bin/spawnpoint-agent --help exited $(cat "$work/help.rc")"
  show "$work/help.err"
fi

# plan: the shim is the bundle's (bin/../share/spawnpoint/python), found from the launcher
# path the agent got in SPAWNPOINT_AGENT_EXE (its /proc/self/exe is the bundle's ld.so).
shim_dir="$prefix/share/spawnpoint/python"
if [ "$(cat "$work/plan.rc")" -eq 0 ] && grep -q "\"PYTHONPATH\": \"$shim_dir\"" "$work/plan.out"; then
  pass "plan puts the bundle's Python shim on PYTHONPATH ($shim_dir)"
else
  fail "plan exited $(cat "$work/plan.rc") or lacks PYTHONPATH=$shim_dir"
  grep PYTHONPATH "$work/plan.out" | sed 's/^/    | /'
  show "$work/plan.err"
fi

# The shim's package is read from the bytecode the bundle ships (for this machine's
# python3), even where images forbid writing bytecode (PYTHONDONTWRITEBYTECODE).
if [ -x /usr/bin/python3 ]; then
  if PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$shim_dir" /usr/bin/python3 -v -c \
    'import spawnpoint_rank._pool_iter, spawnpoint_rank.worker' >"$work/pyc.out" 2>&1 &&
    [ "$(grep -cE "code object from '$shim_dir/spawnpoint_rank/__pycache__/(_pool_iter|worker)\.cpython-[0-9]+\.pyc'" \
      "$work/pyc.out")" -eq 2 ]; then
    pass "the shim's package loads from the bundle's bytecode"
  else
    fail "the shim's package was compiled, not read from the bundle's bytecode"
    grep -E "spawnpoint_rank|Error" "$work/pyc.out" | sed 's/^/    | /' | head -20
  fi
fi

# run: two local node agents (the agent re-runs itself through the launcher), one rank each.
if [ "$(cat "$work/run.rc")" -eq 0 ]; then
  pass "run of a two-node job exited 0"
else
  fail "run exited $(cat "$work/run.rc")"
  show "$work/run.out"
  show "$work/run.err"
fi
for rank in 0 1; do
  env_file="$work/out/env.$rank"
  if [ ! -f "$env_file" ]; then
    fail "rank $rank did not run (no $env_file)"
    continue
  fi
  leaks=""
  while IFS= read -r line; do
    case "$line" in
      SPAWNPOINT_AGENT_EXE=*) leaks+=" $line" ;;
      *"$prefix/lib" | *"$prefix/lib:"* | *"$prefix/lib/"*) leaks+=" $line" ;;
    esac
  done <"$env_file"
  if [ -z "$leaks" ]; then
    pass "rank $rank sees neither the bundle's lib directory nor SPAWNPOINT_AGENT_EXE"
  else
    fail "rank $rank inherited:$leaks"
  fi
  if grep -qx "LD_LIBRARY_PATH=/opt/user-libs" "$env_file"; then
    pass "rank $rank gets the image's LD_LIBRARY_PATH unchanged"
  else
    fail "rank $rank LD_LIBRARY_PATH is not /opt/user-libs: $(grep LD_LIBRARY_PATH "$env_file")"
  fi
  if grep -qx "PARENT_COMM=spawnpoint-agen" "$env_file"; then
    pass "rank $rank's parent is named spawnpoint-agen(t), not ld-linux"
  else
    fail "rank $rank's parent is $(grep PARENT_COMM "$env_file")"
  fi
done

if [ $failures -ne 0 ]; then
  echo "bundle_test ($mode): $failures check(s) failed"
  exit 1
fi
echo "bundle_test ($mode): all checks passed"
