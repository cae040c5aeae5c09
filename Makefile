# The two commands of the README: `make demo` (the main job on the bundled defaults) and
# `make test` (build and pass every test). Both install their dependencies first.
.PHONY: deps build demo test asan fuzz bench clean

PRESET ?= release
BUILD := build/$(PRESET)

deps:
	bash scripts/install-deps.sh

build: deps
	cmake --preset $(PRESET) >/dev/null
	cmake --build --preset $(PRESET)

demo: build
	bash scripts/demo.sh $(BUILD)/keel

test: build
	ctest --preset $(PRESET) -j2

asan:
	$(MAKE) test PRESET=asan

fuzz: deps
	bash scripts/fuzz.sh 60

clean:
	rm -rf build
