# latentgate: `make run` starts the gateway, `make test` runs the whole suite. Both install first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CONFIG ?= config/latentgate.yaml

.PHONY: install run upstream test lint typecheck redis-server bench bench-proxy bench-hotpath clean

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh scripts/constraints-dev.txt
	@echo "make install: a virtualenv in $(VENV) with latentgate and its test tools (a few minutes the first time; later runs skip this)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# The same steps the Dockerfiles run (torch CPU wheel first, then the package).
	sh scripts/install.sh $(BIN)/python dev
	touch $@

run: install
	$(BIN)/latentgate serve --config $(CONFIG)

# An example model server on :8000 (where `make run` sends chat): OpenAI and v2, echoing.
upstream: install
	$(BIN)/python -m tests.support.upstream --port $(or $(UPSTREAM_PORT),8000)

# A real Redis server (and Sentinel, for the failover tests) for the tests: Debian's packages,
# installed when missing.
redis-server:
	@{ command -v redis-server && command -v redis-sentinel; } >/dev/null 2>&1 || { \
	  echo "installing Debian's redis-server and redis-sentinel for the test suite"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q redis-server redis-sentinel >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null && \
	    $$SUDO apt-get install -y -q redis-server redis-sentinel >/dev/null; }; }
	@command -v redis-server >/dev/null 2>&1 || { echo "redis-server is required by the tests"; exit 1; }
	@command -v redis-sentinel >/dev/null 2>&1 || { echo "redis-sentinel is required by the tests"; exit 1; }

test: install redis-server
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check gateway cache backends tests bench
	$(BIN)/ruff format --check gateway cache backends tests bench

typecheck: install
	$(BIN)/mypy

# Pass-through vs nginx, a bare aiohttp proxy and latentgate; BENCH_ARGS=--litellm adds LiteLLM.
bench-proxy: install
	$(BIN)/python bench/proxy_bench.py $(BENCH_ARGS)

# The hot path on the default config beside nginx and the aiohttp floors; BENCH_ARGS=--profile
# adds py-spy flame graphs (the `bench` extra).
bench-hotpath: install
	$(BIN)/python -m bench.hotpath $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
