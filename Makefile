# The commands the README names. `make test` is what CI runs (through .ci/run).
# `make props` is not in `make test`: it runs the property tests with many random cases.
.PHONY: props oracle test lint unit kubectl-yaml monitoring helm e2e node-e2e scale hostile-load release golden bench bench-compare fuzz image image-reproducible

test: lint unit kubectl-yaml monitoring helm e2e hostile-load node-e2e

lint:
	cargo fmt --all -- --check
	cargo clippy --locked --workspace --all-targets -- -D warnings

# Both crates (the workspace's default members): the engine's tests need none of the server's crates,
# `cargo test -p sidecar-injector-engine` runs them alone.
unit:
	cargo test --locked --workspace

# Manifests read and written exactly as kubectl reads them: a differential test against kubectl's
# own YAML reader, built from Go modules with the e2e control plane (tests/kubectl_yaml.rs).
kubectl-yaml:
	bash e2e/controlplane/build.sh
	SIDECAR_INJECTOR_YAMLREAD=$(CURDIR)/e2e/bin/yamlread cargo test --locked --test kubectl_yaml

# The alerts of deploy/components/monitoring under `promtool test rules`, with promtool built from
# the Go module proxy (e2e/tools/build.sh), and the metrics the rules and dashboard use checked
# against what the injector exports (tests/monitoring.rs).
monitoring:
	bash e2e/tools/build.sh
	SIDECAR_INJECTOR_PROMTOOL=$(CURDIR)/e2e/bin/promtool cargo test --locked --test monitoring -- --nocapture

# The Helm chart against deploy/: rendered with each overlay's and component's values it must give
# kustomize's objects (tests/helm.rs), and `helm lint --strict` passes; helm is built from the Go
# module proxy (e2e/tools/build.sh), kustomize is kubectl's (e2e/controlplane/build.sh).
helm:
	bash e2e/controlplane/build.sh
	bash e2e/tools/build.sh
	SIDECAR_INJECTOR_HELM=$(CURDIR)/e2e/bin/helm SIDECAR_INJECTOR_KUBECTL=$(CURDIR)/e2e/bin/kubectl cargo test --locked --test helm -- --nocapture

# The build command of the Dockerfile.
release:
	cargo build --release --locked

# End to end on a whole cluster built from Go modules: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and KWOK's simulated nodes (needs Go; the first build takes several minutes, later
# runs reuse it). Uses the release binary.
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
e2e: release
	SIDECAR_INJECTOR_E2E=1 SIDECAR_INJECTOR_BIN=$(TARGET_DIR)/release/sidecar-injector cargo test --locked --test e2e

# End to end on a real node: kubelet, containerd, runc, the CNI bridge and kube-proxy beside the
# control plane (e2e/node/build.sh builds them), the injector installed from its image with
# `kubectl apply -k` and injected sidecars really running (tests/node_e2e; needs root).
# The injector's image is the Dockerfile built by BuildKit for linux/amd64 from the working tree
# (e2e/image/build.sh; tests/image.rs checks it against the Dockerfile).
node-e2e: release
	bash e2e/tools/build.sh
	bash e2e/image/build.sh --platforms linux/amd64 --worktree --out $(TARGET_DIR)/image
	SIDECAR_INJECTOR_IMAGE=$(TARGET_DIR)/image/sidecar-injector.oci.tar cargo test --locked --test image -- --nocapture
	SIDECAR_INJECTOR_IMAGE=$(TARGET_DIR)/image/sidecar-injector.oci.tar SIDECAR_INJECTOR_HELM=$(CURDIR)/e2e/bin/helm SIDECAR_INJECTOR_NODE_E2E=1 SIDECAR_INJECTOR_BIN=$(TARGET_DIR)/release/sidecar-injector cargo test --locked --test node_e2e

# The scale run (not in `make test`): PODS pods in NAMESPACES namespaces with 200 templates, beside
# NODES nodes as large as real ones that post their status once a minute each, then CHURN_MINUTES of
# pods created and deleted at CHURN_RATE a second, half through the injector and half through a null
# webhook with the same configuration. Prints and checks memory, sync time (pods and nodes), LIST and
# watch traffic, the drift gauge, admission cost with the pod index and with the node pool, and the
# churn's latency, CPU and RSS (tests/e2e/scale.rs). About 4 minutes as it is, 13 with CHURN_MINUTES=10
# (the issue's goal for the churn: 10 minutes or more); PODS=150000 NAMESPACES=10000 NODES=5000 is the
# largest cluster Kubernetes supports (2 cores sustain CHURN_RATE=75 beside it, not 100: see
# docs/performance.md). The test is built optimized (the props profile: about 6 minutes the first
# time), so that driving 100 pods/s does not take a core from the cluster it measures and the node
# pool's cost per decision is timed as the injector runs it.
PODS ?= 10000
NAMESPACES ?= 1000
NODES ?= 500
CHURN_MINUTES ?= 2
CHURN_RATE ?= 100
scale: release
	SIDECAR_INJECTOR_SCALE_PODS=$(PODS) SIDECAR_INJECTOR_SCALE_NAMESPACES=$(NAMESPACES) SIDECAR_INJECTOR_SCALE_NODES=$(NODES) SIDECAR_INJECTOR_SCALE_CHURN_MINUTES=$(CHURN_MINUTES) SIDECAR_INJECTOR_SCALE_CHURN_RATE=$(CHURN_RATE) SIDECAR_INJECTOR_E2E=1 SIDECAR_INJECTOR_E2E_SCALE=1 SIDECAR_INJECTOR_BIN=$(TARGET_DIR)/release/sidecar-injector cargo test --locked --profile props --test e2e -- --nocapture

# The release image (not in `make test`; needs root): the Dockerfile built with BuildKit for
# linux/amd64 and linux/arm64 from the commit into dist/ (the OCI archive of the index, each
# platform's SBOM, the provenance, the signatures, the public key), each platform's binary checked
# and the arm64 one run under qemu-user, signed and verified with cosign (e2e/image/build.sh, then release.sh).
# `make image-reproducible` builds it three times (the cache as it is, cached, cold) and fails
# unless all give one index digest.
image:
	bash e2e/image/build.sh
	bash e2e/image/release.sh

image-reproducible:
	bash e2e/image/reproducible.sh

# Attacks on :8443 against the release binary with a fresh-connection canary and peak RSS against
# the Deployment's memory limit (tests/hostile_load.rs; about a minute).
hostile-load: release
	SIDECAR_INJECTOR_BIN=$(TARGET_DIR)/release/sidecar-injector cargo test --locked --test hostile_load -- --nocapture

# The API server as the oracle (tests/e2e/oracle.rs): ORACLE_CASES cases of the property generator
# injected by the engine and created with server-side dry-run on the e2e API server; prints the
# count, refusals and cases per second. `make e2e` runs a fixed set of 300 from a fixed seed; here the seed is new each run (printed), and
# ORACLE_SEED=N replays one.
ORACLE_CASES ?= 5000
oracle: release
	SIDECAR_INJECTOR_ORACLE_CASES=$(ORACLE_CASES) SIDECAR_INJECTOR_ORACLE_SEED=$(ORACLE_SEED) SIDECAR_INJECTOR_E2E_ONLY=s37 SIDECAR_INJECTOR_E2E=1 SIDECAR_INJECTOR_BIN=$(TARGET_DIR)/release/sidecar-injector cargo test --locked --test e2e

# Regenerate the golden files after an intended change, then review `git diff crates/engine/tests/golden`.
golden:
	UPDATE_GOLDEN=1 cargo test --locked -p sidecar-injector-engine --test golden

bench:
	cargo bench --locked -p sidecar-injector-engine --bench engine

# The engine bench's re-admission rows of BENCH_BASE and of the work tree, side by side, in one run.
BENCH_BASE ?= HEAD
bench-compare:
	bench/compare-engine.sh $(BENCH_BASE)

# The property tests (crates/engine/tests/properties.rs) with PROPS_CASES new random cases each (make test runs a
# fixed set); PROPS_SEED=N replays a run. Each property runs alone and prints its cases and time. A
# failure is persisted to crates/engine/tests/properties.proptest-regressions: commit it with the fix.
PROPS_CASES ?= 50000
props:
	cargo test --profile props --locked -p sidecar-injector-engine --test properties --no-run
	@total=$$(date +%s); for property in $$(cargo test --profile props --locked -p sidecar-injector-engine --test properties -- --list 2>/dev/null | sed -n 's/: test$$//p'); do \
		start=$$(date +%s); \
		PROPS_CASES=$(PROPS_CASES) cargo test --profile props --locked -p sidecar-injector-engine --test properties -- --exact $$property --nocapture --quiet >$(TARGET_DIR)/props-$$property.log 2>&1 \
			|| { cat $(TARGET_DIR)/props-$$property.log; echo "props: $$property FAILED"; exit 1; }; \
		grep -h '^props:' $(TARGET_DIR)/props-$$property.log | head -1; \
		echo "props: $$property: $(PROPS_CASES) cases passed in $$(( $$(date +%s) - start )) s"; \
	done; echo "props: every property passed $(PROPS_CASES) cases in $$(( $$(date +%s) - total )) s"

# Fuzzing with libFuzzer (needs the nightly toolchain and `cargo install cargo-fuzz`): each target
# for FUZZ_SECONDS. New findings land in fuzz/artifacts/; commit a reproducer as
# fuzz/corpus/<target>/regression-<name> so that `cargo test` replays it (tests/fuzz_corpus.rs).
FUZZ_SECONDS ?= 300
fuzz:
	cd fuzz && for target in admission template patch; do \
		cargo +nightly fuzz run -O $$target corpus/$$target -- -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 || exit 1; \
	done
