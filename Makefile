# The commands the README names. `make test` is what CI runs (through .ci/run).
.PHONY: test lint unit e2e release golden bench

test: lint unit e2e

lint:
	cargo fmt --all -- --check
	cargo clippy --locked --all-targets -- -D warnings

unit:
	cargo test --locked

# The build command of the Dockerfile.
release:
	cargo build --release --locked

# End to end on a real kube-apiserver and etcd built from Go modules (needs Go; the first build of
# the control plane takes several minutes, later runs reuse it). Uses the release binary.
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
e2e: release
	SIDECAR_INJECTOR_E2E=1 SIDECAR_INJECTOR_BIN=$(TARGET_DIR)/release/sidecar-injector cargo test --locked --test e2e

# Regenerate the golden files after an intended change, then review `git diff tests/golden`.
golden:
	UPDATE_GOLDEN=1 cargo test --locked --test golden

bench:
	cargo bench --locked --bench engine
