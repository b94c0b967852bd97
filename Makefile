# The two commands a newcomer runs (see README.md):
#   make demo   compress a sample agent context with the default model
#   make test   the whole test suite (format, lints, unit + integration tests)
# Both install what they need first (models/setup.sh is idempotent).

export SCD_ORT_LIB ?= $(CURDIR)/.tools/ort/libonnxruntime.so
export SCD_MODELS_DIR ?= $(CURDIR)/models/out

.PHONY: setup demo test bench build
setup:
	@models/setup.sh

# scd (the product) and scd-dev (eval, tune, the bench commands, the ATP
# demo and simulator; docs/testing.md#developer-tools), side by side in
# target/release: scd-dev starts the scd beside it
build: setup
	cargo build --release -p scd-service -p scd-dev

demo: build
	./target/release/scd demo

test: setup
	service/tests/setup.sh
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	# the binary without the ATP stack (feature `atp` off) builds and lints clean
	cargo clippy -p scd-service --no-default-features --lib --bins -- -D warnings
	SCD_REQUIRE_MODELS=1 cargo test --workspace
	# the learned scorer's fitting (models/fit_scorer.py)
	.tools/venv/bin/python -m unittest discover -s models -p 'test_*.py'
	# the Python client and its LangChain / LlamaIndex adapters against a
	# real `scd serve` (target/debug/scd, which cargo test just built)
	SCD_REQUIRE_MODELS=1 service/clients/python/run-tests.sh
	# the GPU build, without a GPU: it compiles, lints clean, and --device cuda
	# fails naming what is missing instead of falling back to the CPU
	cargo clippy -p scd-service --all-targets --features cuda -- -D warnings
	SCD_REQUIRE_MODELS=1 cargo test -p scd-engine --features cuda --test tests cuda

bench: setup
	models/setup.sh e5-large-arch
	cargo bench -p scd-benches
