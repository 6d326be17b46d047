# Convenience wrapper around CMake. The two commands a new user needs:
#   make train    prepare TinyShakespeare and train gpt2-tiny (GPU if present, else the CPU reference);
#                 a run stopped by Ctrl-C continues from its checkpoint (--resume auto, unless ARGS
#                 says --resume or --init-from)
#   make test     build and run every test (GPU tests skip where no GPU exists)
BUILD ?= build
JOBS ?= $(shell nproc)
CONFIG ?= gpt2-tiny
ARGS ?=
CMAKE_ARGS ?=
CTEST_ARGS ?=
SHARDS := data/tinyshakespeare/val_000000.bin

.PHONY: all setup configure build bin test train data tokenizer corpus clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: setup $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# The trainer binary alone (what `make train` and `make data` need; the test suite is `make test`'s).
bin: configure
	cmake --build $(BUILD) -j$(JOBS) --target codagpt

tokenizer:
	@bash scripts/get_tokenizer.sh

corpus:
	@bash scripts/get_data.sh

data: $(SHARDS)

$(SHARDS): | bin tokenizer corpus
	./$(BUILD)/codagpt prepare --input data/tinyshakespeare.txt --out data/tinyshakespeare --split-on-blank-lines

train: bin data
	./$(BUILD)/codagpt train --config $(CONFIG) $(if $(filter --resume% --init-from%,$(ARGS)),,--resume auto) $(ARGS)

test: build tokenizer corpus
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) $(CTEST_ARGS)

clean:
	rm -rf $(BUILD)
