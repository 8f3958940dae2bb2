# Two set-up commands for a newcomer: `make demo` and `make test`. Both create .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test tools devcluster devcluster-down bench lint clean lock

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
# Prometheus), built once per machine into ~/.cache/muster; versions pinned in shared/parts/versions.toml.
tools:
	$(PY) -m shared.parts.build

# A real cluster left running on this machine: KUBECONFIG=build/devcluster/kubeconfig.
# BATCH_SCHEDULER=none|volcano|kai-scheduler|scheduler-plugins (KubeRay's), NODES=FILE (KWOK nodes).
devcluster: $(STAMP) tools
	$(BIN)/muster devcluster up

devcluster-down: $(STAMP)
	$(BIN)/muster devcluster down

test: $(STAMP) tools
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest

bench: $(STAMP) tools
	$(BIN)/python -m bench.run $(SECTIONS)

# The image's pinned, hashed dependencies (Dockerfile) from pyproject.toml's; run after changing them.
lock: $(STAMP)
	$(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
		--no-emit-find-links --output-file requirements.lock pyproject.toml

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
