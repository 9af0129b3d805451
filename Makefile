# The commands the README names. `make test` is what CI runs (through .ci/run).
.PHONY: test lint unit golden bench

test: lint unit

lint:
	cargo fmt --all -- --check
	cargo clippy --locked --all-targets -- -D warnings

unit:
	cargo test --locked

# Regenerate the golden files after an intended change, then review `git diff tests/golden`.
golden:
	UPDATE_GOLDEN=1 cargo test --locked --test golden

bench:
	cargo bench --locked --bench engine
