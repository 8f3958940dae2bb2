# Two set-up commands for a newcomer: `make demo` and `make test`. Both create .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit integration e2e tools devcluster devcluster-down compare bench lint clean lock

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

DEMO := build/demo

demo: $(STAMP)
	@for f in examples/*.yaml; do $(BIN)/muster simulate $$f --check || exit 1; done
	@mkdir -p $(DEMO) && rm -f $(DEMO)/history.db*
	@$(BIN)/muster simulate examples/fair-share-two-teams.yaml -q --store sqlite:///$(DEMO)/history.db
	@$(BIN)/muster report --store sqlite:///$(DEMO)/history.db --html $(DEMO)/report.html > /dev/null
	@echo "report of examples/fair-share-two-teams.yaml (open it in a browser): $(CURDIR)/$(DEMO)/report.html"

# The real parts the tests run against (kube-apiserver, etcd, KWOK, KubeRay, Kafka, PostgreSQL, Jaeger,
# Prometheus, KAI Scheduler), built once per machine into ~/.cache/muster; versions pinned in shared/parts/versions.toml.
tools:
	$(PY) -m shared.parts.build

# A real cluster left running on this machine: KUBECONFIG=build/devcluster/kubeconfig.
# BATCH_SCHEDULER=none|volcano|kai-scheduler|scheduler-plugins (KubeRay's), NODES=FILE (KWOK nodes),
# PEER=volcano|kai (the real peer scheduler beside it, shared/parts/peers.py; KubeRay then with its setting).
devcluster: $(STAMP) tools
	$(BIN)/muster devcluster up

devcluster-down: $(STAMP)
	$(BIN)/muster devcluster down

# muster beside a real peer scheduler (shared/peers/compare.py): every scenario file of the peer's dialect on a
# fresh dev cluster, scheduled once by the peer and once by muster; writes docs/peers.md and fails on a
# difference docs/design/peers.md does not mark deliberate (about 22 minutes for Volcano's 23 files, 35 for KAI's 19, three of them paced by the wall clock;
# each peer rewrites only its own section of docs/peers.md). PEER=volcano|kai;
# FILES="stem ..." reruns a few and keeps the other rows; `.venv/bin/python -m shared.peers.compare PEER --render`
# redoes docs/peers.md from the saved rows (build/peers-PEER.json) after a change to docs/design/peers.md.
PEER ?= volcano
compare: $(STAMP) tools
	$(BIN)/python -m shared.peers.compare $(PEER) "" $(FILES)

# The test tiers (docs/parts.md, "Tests"); every folder of test files is in exactly one of them
# (tests/unit/test_tiers.py checks it). unit: no real part; integration: real Kafka, PostgreSQL,
# Prometheus and Jaeger; e2e: a real cluster (kube-apiserver, KWOK, KubeRay). `make test` runs the
# import contracts and mypy (`make lint`), then all three in one pytest run (the session's Kafka and PostgreSQL started once).
UNIT_TESTS := tests/unit tests/property tests/replay tests/scenarios tests/cli
INTEGRATION_TESTS := tests/integration tests/deploy
E2E_TESTS := tests/realcluster tests/peers

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest $(UNIT_TESTS)

integration: $(STAMP) tools
	$(BIN)/python -m pytest $(INTEGRATION_TESTS)

e2e: $(STAMP) tools
	$(BIN)/python -m pytest $(E2E_TESTS)

test: $(STAMP) tools lint
	$(BIN)/python -m pytest --durations=30 $(UNIT_TESTS) $(INTEGRATION_TESTS) $(E2E_TESTS)

bench: $(STAMP) tools
	$(BIN)/python -m bench.run $(SECTIONS)

# The image's pinned, hashed dependencies (Dockerfile) from pyproject.toml's; run after changing them.
lock: $(STAMP)
	$(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
		--no-emit-find-links --output-file requirements.lock pyproject.toml

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
