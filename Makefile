# Thin wrapper: every target installs what is missing, configures once and builds with ninja.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: deps demo-deps configure build test demo demo-cpp cluster-tools cluster-up cluster-down chart-local bench-launch bench-restart bench-first-steps bench-loader bench-kube demo-cluster bench-operator bench-metrics bench-frameworks bench-first-batch fuzz chaos test-asan test-tsan test-repeat agent-bundle images frameworks-env chart sync-chart-crds format clean

deps:
	@bash scripts/install-deps.sh

# Only what make demo needs (install-deps.sh --demo): no kubectl, helm or Go.
demo-deps:
	@bash scripts/install-deps.sh --demo

# The full tree. A build directory that make demo configured for the agent alone
# (SPAWNPOINT_AGENT_ONLY, CMakeLists.txt) is reconfigured to the full tree, its objects kept.
configure: deps
	@if [ ! -f $(BUILD)/build.ninja ] || grep -qx 'SPAWNPOINT_AGENT_ONLY:BOOL=ON' $(BUILD)/CMakeCache.txt; then \
	  echo "cmake -S . -B $(BUILD) -G Ninja -DSPAWNPOINT_AGENT_ONLY=OFF $(CMAKE_FLAGS)"; \
	  cmake -S . -B $(BUILD) -G Ninja -DSPAWNPOINT_AGENT_ONLY=OFF $(CMAKE_FLAGS); \
	fi

build: configure
	ninja -C $(BUILD) -j $(JOBS)

# Ends with the tests that did not run (skipped, not run, disabled), each with its reason and
# whether tests/skip-allowlist.txt allows it (scripts/test-skips.py), then the chaos run's
# summary when it wrote one; the last line `skips: total=N not_run=N allowlisted=N outside=N`.
# The list prints when tests fail too; the exit status is ctest's. (A test's output past 300 kB
# loses its middle, not its end, where the runners print why they skipped.) CHECK_SKIPS=1
# (.ci/run) also fails the target when a test outside the allowlist did not run.
CHECK_SKIPS ?=
SKIPS_REPORT = /usr/bin/python3 scripts/test-skips.py --allowlist tests/skip-allowlist.txt \
  $(if $(CHECK_SKIPS),--check)
test: build cluster-tools
	rm -f $(BUILD)/Testing/ctest-junit.xml $(BUILD)/Testing/chaos-summary.txt
	status=0; (cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600 \
	  --output-junit "$$PWD/Testing/ctest-junit.xml" --test-output-truncation middle) \
	  || status=$$?; \
	$(SKIPS_REPORT) --title "make test" --junit $(BUILD)/Testing/ctest-junit.xml \
	  --also $(BUILD)/Testing/chaos-summary.txt || status=$$?; \
	exit $$status

# The whole suite under sanitizers, each in a build directory of its own (build-asan,
# build-tsan): ASan + UBSan + LSan (any finding aborts), or TSan. A report from any process
# fails the run; exclusions and their reasons are in scripts/sanitizer-tests.sh. Like make test
# they end with the tests that did not run (CHECK_SKIPS=1: one outside the allowlist fails).
# CTEST_ARGS passes more to ctest (e.g. CTEST_ARGS="-R Gang").
test-asan: deps cluster-tools
	bash scripts/sanitizer-tests.sh asan --jobs $(JOBS) $(if $(CHECK_SKIPS),--check-skips) \
	  -- $(CTEST_ARGS)

test-tsan: deps cluster-tools
	bash scripts/sanitizer-tests.sh tsan --jobs $(JOBS) $(if $(CHECK_SKIPS),--check-skips) \
	  -- $(CTEST_ARGS)

# The process and timing tests N times each with a core kept busy (scripts/test-repeat.sh
# says which); any failure fails it. Last line: test-repeat n=N tests=T runs=R failed=F ...
N ?= 20
test-repeat: build
	bash scripts/test-repeat.sh --n $(N) --build-dir $(BUILD) --jobs $(JOBS)

# The libFuzzer targets of tests/fuzz (ASan+UBSan, clang, in $(FUZZ_BUILD)), each run for
# FUZZ_SECONDS from its seed corpus; last line `fuzz targets=N execs=N crashes=N`. A crash (or
# leak, UB, timeout) fails it, its input kept in $(FUZZ_BUILD)/fuzz-artifacts/. .ci/run runs it
# when time allows.
FUZZ_SECONDS ?= 30
FUZZ_BUILD ?= build-fuzz
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_BUILD=$(FUZZ_BUILD) JOBS=$(JOBS) bash tests/fuzz/run_fuzz.sh

# The chaos run (tests/chaos/README.md): the operator behind kube-fault-proxy on the real control
# plane, two-node jobs for about CHAOS_SECONDS while a seeded schedule SIGKILLs the operator, a
# rank and a loader worker, SIGSTOPs a worker, SIGTERMs an agent, injects API errors and fills
# /dev/shm; then phases, parameters, status histories, leaks and the faults injected are
# checked: a planned fault that was not injected fails the run. Last line `chaos seed=S
# faults=N jobs=N succeeded=N failed_as_expected=N wrong_phase=N leaks=N <kind>=I/M ...
# missed=N` (injected/missed per kind). CHAOS_SEED (default: from the clock, printed first)
# replays a run: make chaos CHAOS_SEED=S
CHAOS_SECONDS ?= 240
chaos: build cluster-tools
	CHAOS_SEED=$(CHAOS_SEED) CHAOS_SECONDS=$(CHAOS_SECONDS) /usr/bin/python3 tests/chaos/chaos.py \
	  --source-dir . --build-dir $(BUILD)

# The Python example (examples/python/demo.yaml): 2 CPU DDP ranks through the agent. Installs
# and builds only what it runs: the agent and its Python shim (a fresh build directory is
# configured for the agent alone; a full one is used as it is). README.md says how long.
demo: demo-deps
	@if [ ! -f $(BUILD)/build.ninja ]; then \
	  echo "cmake -S . -B $(BUILD) -G Ninja -DSPAWNPOINT_AGENT_ONLY=ON $(CMAKE_FLAGS)"; \
	  cmake -S . -B $(BUILD) -G Ninja -DSPAWNPOINT_AGENT_ONLY=ON $(CMAKE_FLAGS); \
	fi
	ninja -C $(BUILD) -j $(JOBS) spawnpoint-agent shim-bytecode
	BUILD=$(BUILD) bash scripts/demo.sh python

# The C++ example (examples/local-cpu.yaml): the libtorch DDP trainer and its loader workers.
demo-cpp: configure
	ninja -C $(BUILD) -j $(JOBS) spawnpoint-agent spawnpoint-example-trainer
	BUILD=$(BUILD) bash scripts/demo.sh cpp

# The pinned control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
# built into .tools/bin (once: several minutes; the `cluster` tests use it), and started on
# loopback; cluster-up's last line is `kubeconfig: PATH`. CLUSTER_DIR (default .cache/cluster)
# holds its state and logs.
cluster-tools: deps
	@bash scripts/install-tools.sh --control-plane

cluster-up: cluster-tools
	bash scripts/cluster.sh up $(if $(CLUSTER_DIR),--dir $(CLUSTER_DIR))

cluster-down:
	bash scripts/cluster.sh down $(if $(CLUSTER_DIR),--dir $(CLUSTER_DIR))

# The operator end to end on this machine, on the real control plane (scripts/cluster.sh)
# whose local node runs the pods as processes. JOB=manifest (default
# examples/local-cluster.yaml), e.g. JOB=examples/python/ddp.yaml.
demo-cluster: build cluster-tools
	JOB=$(JOB) bash operator/demo/demo-cluster.sh

# The Helm chart tried on this machine (operator/demo/chart-local.sh): installed on the local
# control plane, the operator Deployment's pod Pending (the local node runs commands, not
# images) and the built operator run beside the cluster as that pod (its arguments, its
# ServiceAccount's token), the example job to Succeeded. CHART_LOCAL_KEEP=1 keeps it all up.
chart-local: build cluster-tools
	bash operator/demo/chart-local.sh

bench-kube: build cluster-tools
	bash bench/kube/kube_bench.sh

bench-operator: build cluster-tools
	bash bench/operator/operator_bench.sh

bench-launch: build
	bash bench/launch_bench.sh

# Restarts: first through the operator, restartPolicy.mode InPlace vs Recreate, also with a
# simulated pod start latency (bench/restart_bench.py --help; BENCH_ARGS=--quick for one run);
# then a rank's death -> restarted first step and the first start against torchrun of the same
# torch at its defaults, torch 2.6 (frameworks environment; root needed) and 1.13
# (bench/restart_torchrun.sh). Last line `ratios restart_torchvision=X restart_lightning=Y
# start_overhead_pct=Z restart_torchvision_113=.. start_overhead_pct_113=.. inplace_vs_recreate=..`.
TORCHRUN_REPS ?= 3
bench-restart: build cluster-tools agent-bundle
	@bash -o pipefail -c '/usr/bin/python3 bench/restart_bench.py --build $(BUILD) $(BENCH_ARGS) | tee $(BUILD)/bench-restart-operator.txt'
	@bash -o pipefail -c 'BUILD=$(BUILD) bash bench/restart_torchrun.sh --reps $(TORCHRUN_REPS) | tee $(BUILD)/bench-restart-torchrun.txt'
	@echo "$$(grep '^ratios ' $(BUILD)/bench-restart-torchrun.txt | tail -n 1)" \
	  "$$(grep '^ratios ' $(BUILD)/bench-restart-operator.txt | tail -n 1 | cut -d' ' -f2-)"

# The first 20 steps of a torch + torchvision DDP script, the agent against torchrun 2.6.
bench-first-steps: build agent-bundle
	@BUILD=$(BUILD) bash bench/restart_torchrun.sh --first-steps --reps $(TORCHRUN_REPS)

# Builds only what it runs: the exposition library needs none of the rest of the tree.
bench-metrics: configure
	ninja -C $(BUILD) -j $(JOBS) spawnpoint-metrics-bench
	BUILD=$(BUILD) bash bench/metrics/metrics_bench.sh

bench-loader: build
	bash bench/loader_bench.sh

# Ultralytics' train() -> first batch, the agent's pool against stock DataLoader, in the
# frameworks environment (root needed): make bench-frameworks BENCH_ARGS=5
bench-frameworks: build
	BUILD=$(BUILD) bash bench/ultralytics_bench.sh $(BENCH_ARGS)

# imagenet/main.py's start to its first batch (bench/first_batch_trainer.py, -j 4, 2 CPU
# ranks): the agent at its defaults against torchrun with forked and with spawned workers.
# Last line `ratios fork=X spawn=Y` (above 1: ours first). BENCH_ARGS="--reps 10" for more.
bench-first-batch: build
	/usr/bin/python3 bench/first_batch_bench.py --build $(BUILD) $(BENCH_ARGS)

# The self-contained agent (binary, libraries, ld.so) the agent image carries.
agent-bundle: configure
	ninja -C $(BUILD) -j $(JOBS) agent-bundle
	@echo "bundle: $(BUILD)/agent-bundle"

# The two images the chart pulls, ghcr.io/spawnpoint/{agent,operator}:<appVersion>, from this
# build tree, as OCI archives in $(BUILD)/images/ (scripts/images.sh, images/README.md):
# docker build when a Docker engine answers, else buildah (no daemon; needs root).
images: configure
	ninja -C $(BUILD) -j $(JOBS) spawnpoint-operator agent-bundle
	bash scripts/images.sh --build-dir $(BUILD)

# The pinned environment of the users' training stacks (Debian 13's torch and torchvision,
# Lightning from PyPI in a venv of the trixie-frameworks root), made once and reused; the last
# line is `python: PATH (in ROOT; ...)`. Needs root.
frameworks-env: deps
	@bash scripts/frameworks-env.sh

# The chart as `helm template` renders it, with the pinned helm 3 of the tools folder
# (scripts/install-tools.sh): make chart VALUES=my-values.yaml
chart: deps
	.tools/bin/helm3 template spawnpoint charts/spawnpoint --namespace spawnpoint-system \
	  --include-crds $(if $(VALUES),--values $(VALUES))

# The chart's crds/ is a copy of crds/ (Helm packages cannot follow links out of a chart);
# chart_test fails until they are identical.
sync-chart-crds:
	cp crds/trainingjob.yaml charts/spawnpoint/crds/trainingjob.yaml

format:
	git ls-files '*.cc' '*.h' '*.c' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
