# Thin wrapper: every target installs what is missing, configures once and builds with ninja.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: deps configure build test demo bench-launch bench-kube format clean

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: deps $(BUILD)/build.ninja

build: configure
	ninja -C $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

demo: build
	bash scripts/demo.sh

bench-kube: build
	bash bench/kube/kube_bench.sh

bench-launch: build
	bash bench/launch_bench.sh

format:
	git ls-files '*.cc' '*.h' '*.c' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
