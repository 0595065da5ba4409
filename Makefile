# Two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-test
SERVE_STAMP := $(VENV)/.installed-serve

SEED     ?= 1
DURATION ?= 3m
RUN_DIR  ?= runs/chaos-seed$(SEED)-$(DURATION)

.PHONY: serve test debian-test-packages lint typecheck typecheck-tests pytest bench chaos fuzz image image-name \
        image-push k8s-image clean js

# The browser client and dashboard (clients/js), bundled once by esbuild into the files
# the server serves (migratory/server/static/, not committed). Needs node >= 20 and npm.
JS_DIR     := clients/js
JS_DEPS    := $(JS_DIR)/node_modules/.package-lock.json
JS_BUILT   := migratory/server/static/client/migratory.js
JS_SOURCES := $(wildcard $(JS_DIR)/src/*.js $(JS_DIR)/dashboard/*) $(JS_DIR)/scripts/build.mjs \
              $(JS_DIR)/scripts/close_codes_js.py migratory/protocol/close_codes.py

$(VENV)/.created:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	touch $@

# serving needs only the package itself: no test, chaos or Spark extras
$(SERVE_STAMP): pyproject.toml $(VENV)/.created
	$(PY) -m pip install --quiet -e .
	touch $@

# --no-compile: pip's byte-compiling of every installed file (PySpark's thousands among
# them) is never read by the tests, whose processes keep their bytecode under
# PYTHONPYCACHEPREFIX (below); it cost ~8 of ~38 CPU-s of this install (load 20)
$(STAMP): pyproject.toml $(VENV)/.created
	$(PY) -m pip install --quiet --no-compile -e '.[test]'
	touch $@ $(SERVE_STAMP)

$(JS_DEPS): $(JS_DIR)/package.json $(JS_DIR)/package-lock.json
	cd $(JS_DIR) && npm ci --no-audit --no-fund
	touch $@

$(JS_BUILT): $(JS_DEPS) $(JS_SOURCES)
	cd $(JS_DIR) && npm run --silent build

js: $(JS_BUILT)

# The browser files only where npm is: a fresh machine with Python and make serves
# without them (GET /client/migratory.js and /dashboard/ then say `make js`).
NPM := $(shell command -v npm 2>/dev/null)
serve: $(SERVE_STAMP) $(if $(NPM),$(JS_BUILT),)
	$(if $(NPM),,@echo "no npm: the browser client and dashboard are not built (make js: node >= 20)")
	$(VENV)/bin/migratory serve $(if $(CONFIG),--config $(CONFIG),)

# Debian packages the tests run: mosquitto_pub / mosquitto_sub (independent MQTT clients),
# chromium and its chromedriver (the browser tests, through selenium), the mosquitto and
# nats-server brokers (`migratory bench --compare`, tests/bench; their binaries are in /usr/sbin)
# gcc and libssl-dev: the benchmark's C subscriber swarm (migratory/bench/swarm.c)
DEBIAN_TEST_PACKAGES := mosquitto-clients chromium chromium-driver mosquitto nats-server \
  gcc libssl-dev
DEBIAN_TEST_COMMANDS := mosquitto_sub mosquitto_pub chromium chromedriver mosquitto nats-server \
  gcc
DEBIAN_TEST_FILES := /usr/include/openssl/ssl.h
debian-test-packages:
	@missing=; for c in $(DEBIAN_TEST_COMMANDS); do \
	  command -v $$c >/dev/null || test -x /usr/sbin/$$c || missing=1; done; \
	for f in $(DEBIAN_TEST_FILES); do test -f $$f || missing=1; done; \
	[ -z "$$missing" ] || { \
	  echo "installing $(DEBIAN_TEST_PACKAGES) (apt-get)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    $(DEBIAN_TEST_PACKAGES); }

# The browser client's tests (npm test: tsc, then node's runner, 30-40 s mostly waiting on
# timers and sockets, ~7 s of CPU) run beside pytest, their output after pytest's: they
# held up pytest's start by that much (whole run 12:57, pytest 12:12 in CI). So do the
# static checks (ruff, mypy of the product and of the tests: ~40-50 s on a fresh clone,
# most of the 50 s between pytest's 14:38 and the whole run's 15:28 in the CI of e140b707);
# every one runs whatever another says, and make fails if any fails.
JS_TEST_LOG := $(CURDIR)/$(VENV)/npm-test.log
CHECKS_LOG := $(CURDIR)/$(VENV)/static-checks.log

# The tests' Python processes keep their bytecode (in the venv, not in the tree), whatever
# the environment says: with PYTHONDONTWRITEBYTECODE set (as on the CI box) every process
# compiled the project's modules again -- each of the three workers collecting the suite,
# each member, worker and client process the tests start (tests/test_makefile.py)
test: $(STAMP) $(JS_BUILT) debian-test-packages
	rm -f $(JS_TEST_LOG) $(JS_TEST_LOG).status $(CHECKS_LOG) $(CHECKS_LOG).status
	(status=0; $(VENV)/bin/ruff check . || status=1; $(VENV)/bin/mypy || status=1; \
	  $(MAKE) --no-print-directory typecheck-tests || status=1; \
	  echo $$status > $(CHECKS_LOG).status) > $(CHECKS_LOG) 2>&1 &
	(cd $(JS_DIR) && npm test; echo $$? > $(JS_TEST_LOG).status) > $(JS_TEST_LOG) 2>&1 &
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/$(VENV)/pycache $(PY) -m pytest -n 3; \
	  tests=$$?; waited=0; until { test -s $(JS_TEST_LOG).status && \
	    test -s $(CHECKS_LOG).status; } || test $$waited -ge 300; do \
	    sleep 1; waited=$$((waited + 1)); done; cat $(JS_TEST_LOG) $(CHECKS_LOG); \
	  js=$$(cat $(JS_TEST_LOG).status 2>/dev/null || echo "none: still running"); \
	  checks=$$(cat $(CHECKS_LOG).status 2>/dev/null || echo "none: still running"); \
	  echo "npm test (clients/js): exit status $$js"; \
	  echo "ruff, mypy, mypy of the tests: exit status $$checks"; \
	  test "$$tests" = 0 && test "$$js" = 0 && test "$$checks" = 0

# The tests, not strict (tests/mypy.ini): one mypy run per directory, since the test files
# import their directory's helpers by bare names (pytest puts each directory on sys.path:
# tests/cluster/cluster_faults.py and tests/deploy/cluster_faults.py are two modules).
# About 15 s on a fresh clone, a few with its cache (.mypy_cache/tests).
TEST_DIRS = $(sort $(dir $(shell find tests -name '*.py' -not -path '*/node_modules/*')))
typecheck-tests: $(STAMP)
	@status=0; for dir in $(TEST_DIRS); do \
	  MYPYPATH=$$dir:tests $(VENV)/bin/mypy --config-file tests/mypy.ini \
	    --cache-dir .mypy_cache/tests $$dir*.py || status=1; \
	done; exit $$status

bench: $(STAMP)
	$(PY) benchmarks/fanout.py
	$(PY) benchmarks/idle_connections.py

# A seeded chaos run (default 3 minutes of faults, about 4 minutes in all with the
# Spark check); `make chaos DURATION=30m SEED=7` runs longer. Exit 1 on a violation.
chaos: $(STAMP)
	rm -rf $(RUN_DIR)
	$(PY) -m chaos run --seed $(SEED) --duration $(DURATION) --out $(RUN_DIR)
	$(PY) -m spark_analysis $(RUN_DIR); status=$$?; \
	  echo "chaos report: $(RUN_DIR)/report/report.md (JSON: $(RUN_DIR)/report/summary.json)"; \
	  exit $$status

# Time-bounded fuzzing of each client decoder (WebSocket, CBOR operations, HTTP, MQTT)
# against a live server with a bystander (docs/security.md); `make test` runs a few
# seconds of each, `make fuzz DURATION=10m` shares the duration between them.
fuzz: $(STAMP)
	MIGRATORY_FUZZ_DURATION=$(DURATION) $(PY) -m pytest -s tests/server/test_fuzz_live.py

# The server image (deploy/Dockerfile) with podman or docker, whichever can build here;
# the browser files are built first so that the wheel in the image carries them.
# Each build has its own tag (deploy/image_tag.sh: <version>-g<commit>, -dirty.<hash> more
# for uncommitted changes to the image's files), never one an earlier build had: a node
# that pulled a tag keeps running what it pulled (imagePullPolicy IfNotPresent).
#   make image IMAGE_REPO=registry.example.com/migratory   build it
#   make image-push IMAGE_REPO=...                         push it
#   make k8s-image IMAGE_REPO=...                          set it in deploy/k8s (images:)
#   make -s image-name IMAGE_REPO=...                      print it
IMAGE_REPO ?= migratory
IMAGE_TAG  ?= $(shell sh deploy/image_tag.sh)
IMAGE       = $(IMAGE_REPO):$(IMAGE_TAG)
K8S_DIR    ?= deploy/k8s
CONTAINER_ENGINE = $(shell command -v podman || command -v docker)

image-name:
	@test -n "$(IMAGE_TAG)" || { echo "no image tag: not a git checkout? give IMAGE_TAG=" >&2; exit 1; }
	@echo $(IMAGE)

image: $(JS_BUILT)
	@test -n "$(IMAGE_TAG)" || { echo "no image tag: not a git checkout? give IMAGE_TAG=" >&2; exit 1; }
	@engine=$(CONTAINER_ENGINE); \
	if [ -z "$$engine" ]; then \
	  echo "make image: neither podman nor docker is installed; install one to build $(IMAGE)" >&2; \
	  exit 1; \
	fi; \
	if ! $$engine info >/dev/null 2>&1; then \
	  echo "make image: $$engine is installed but no container engine answers (no daemon or" \
	       "service running here), so $(IMAGE) was not built. What the image runs is tested" \
	       "by tests/deploy/test_image.py (the wheel in a fresh venv, started as a pod)." >&2; \
	  exit 1; \
	fi; \
	echo "building $(IMAGE) with $$engine"; \
	$$engine build -f deploy/Dockerfile -t $(IMAGE) .

image-push:
	@test -n "$(IMAGE_TAG)" || { echo "no image tag: not a git checkout? give IMAGE_TAG=" >&2; exit 1; }
	@test -n "$(CONTAINER_ENGINE)" || { echo "make image-push: neither podman nor docker is installed" >&2; exit 1; }
	$(CONTAINER_ENGINE) push $(IMAGE)

# `images:` of the install (deploy/k8s/kustomization.yaml) set to the image of this tree
k8s-image:
	@test -n "$(IMAGE_TAG)" || { echo "no image tag: not a git checkout? give IMAGE_TAG=" >&2; exit 1; }
	$(PYTHON) deploy/k8s/set_image.py $(K8S_DIR)/kustomization.yaml $(IMAGE_REPO) $(IMAGE_TAG)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(JS_DIR)/node_modules migratory/server/static
