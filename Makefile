# Two set-up commands on a fresh machine: `make run` and `make test` (see README).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
# System packages the main job needs (a JRE for Spark).
APT_PACKAGES := openjdk-17-jre-headless
# The tests add Debian's Prometheus: promtool checks and unit-tests ops/prometheus, and a real
# server scrapes a live worker in tests/ops; kcat drives ads-broker in tests/integration/compat;
# chromium renders the audit report.
APT_TEST_PACKAGES := $(APT_PACKAGES) prometheus zookeeper kcat chromium
# checkov pins its own `hcl2` fork, which clashes with python-hcl2 in .venv: it gets a venv of its own.
CHECKOV_VENV := .venv-checkov

.PHONY: run run-broker test lint unit integration bench clean apt-deps apt-test-deps

# The main job ends with the Spark audit, so the base install includes the spark extra.
$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[spark]'
	touch $@

$(VENV)/.test: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[test]'
	touch $(VENV)/.base $@

# The C record walk (ads_broker/log/_walk.c, pyproject's ext-modules) is compiled by the installs
# above (in place: ads_broker/log/_walk.*.so); this rebuilds it alone when its source changes.
$(VENV)/.walk: ads_broker/log/_walk.c $(VENV)/.base
	$(PIP) install --quiet --no-deps -e .
	touch $@

$(CHECKOV_VENV)/.done: Makefile
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/pip install --quiet 'checkov>=3.3.30,<3.4'
	touch $@

# Java is what Spark's local[2] needs; install it only when no java is on PATH.
apt-deps:
	@command -v java >/dev/null 2>&1 || { \
	  SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $(APT_PACKAGES); }

# The same, plus what only the tests start (promtool, prometheus, ZooKeeper, kcat, chromium); installed when one is missing.
apt-test-deps:
	@{ command -v java && command -v promtool && command -v prometheus && command -v kcat && command -v chromium && [ -e /usr/share/java/zookeeper.jar ]; } >/dev/null 2>&1 || { \
	  SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends $(APT_TEST_PACKAGES); }

# The main job on the embedded default: ads-broker, load generator, dedupe workers, verified output.
run: apt-deps $(VENV)/.base $(VENV)/.walk
	$(PY) -m dedupe_worker.demo

# The broker alone: produce/consume through confluent-kafka, restart, committed offsets.
run-broker: $(VENV)/.base $(VENV)/.walk
	$(PY) -m ads_broker.demo

lint: $(VENV)/.test $(VENV)/.walk
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# ADS_OPS_REQUIRE_TOOLS: the ops checks fail (instead of skipping) when hadolint, checkov or promtool
# is missing, so `make test` can't pass without running them.
# `make test` runs two pytest sessions side by side (docs/TESTING.md): these long tests, which mostly
# wait (paced load, fault recoveries, session timeouts, JVM starts), in one; the rest in the other.
SIDE_TESTS = tests/chaos/worker/test_chaos_ci.py tests/chaos/cluster/test_history.py \
	tests/integration/test_main_job.py tests/integration/audit/test_audit_progress.py \
	tests/integration/cluster/test_interbroker_attacks.py tests/integration/cluster/test_hw_checkpoint.py \
	tests/integration/cluster/test_cluster_security.py \
	tests/chaos/cluster/test_lineage.py tests/integration/cluster/test_create_partitions.py \
	tests/integration/cluster/test_coordinators.py tests/integration/cluster/test_txn_fencing.py \
	tests/integration/cluster/test_interbroker_sasl.py tests/integration/cluster/test_local_cluster.py \
	tests/integration/cluster/test_elect_leaders.py tests/integration/cluster/test_fetch_remote_topic_ids.py \
	tests/unit/audit/test_audit_exports.py \
	tests/integration/cluster/test_zk_hang_client_requests.py tests/integration/audit/test_audit_pairs.py \
	tests/integration/cluster/test_metadata_flood.py tests/integration/cluster/test_replica_fetchers.py \
	tests/integration/cluster/test_delete_topics.py tests/integration/cluster/test_reassign_partitions.py \
	tests/integration/audit/test_audit_hostile.py tests/integration/audit/test_audit_kafka.py \
	tests/integration/audit/test_audit_sasl.py tests/chaos/txn/test_copier.py tests/chaos/worker/test_holes.py \
	tests/integration/cluster/test_local_cluster_listeners.py tests/integration/cluster/test_stray_logs.py \
	tests/integration/cluster/test_reassign_cancel_safety.py tests/integration/cluster/test_duplicate_under_min_isr.py \
	tests/integration/cluster/test_stale_deletion_mark.py tests/integration/cluster/test_removed_replica_topic_kept.py \
	tests/integration/cluster/test_unclean_election.py tests/integration/broker/test_oauthbearer.py

test: apt-test-deps $(VENV)/.test $(VENV)/.walk $(CHECKOV_VENV)/.done lint
	@export ADS_OPS_REQUIRE_TOOLS=1 CHECKOV=$(CURDIR)/$(CHECKOV_VENV)/bin/checkov; \
	ADS_TEST_PORTS=26000-31999 $(VENV)/bin/pytest -p no:cacheprovider $(SIDE_TESTS) > .side-tests.log 2>&1 & side=$$!; \
	ADS_TEST_PORTS=20000-25999 $(VENV)/bin/pytest $(addprefix --ignore=,$(SIDE_TESTS)) tests; main=$$?; \
	wait $$side; side_rc=$$?; \
	echo "== side stream ($(words $(SIDE_TESTS)) files, run beside the rest): exit $$side_rc"; cat .side-tests.log; \
	echo "== main stream: exit $$main, side stream: exit $$side_rc"; \
	test $$main -eq 0 && test $$side_rc -eq 0

unit: $(VENV)/.test $(VENV)/.walk
	$(VENV)/bin/pytest tests/unit

integration: $(VENV)/.test $(VENV)/.walk
	$(VENV)/bin/pytest tests/integration

bench: $(VENV)/.test $(VENV)/.walk
	$(PY) bench/broker_throughput.py

# `make compat` / `make compat-ci`: librdkafka's own suite against ads-broker (docs/COMPATIBILITY.md)
include compat/compat.mk

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) build *.egg-info ads_broker/log/_walk.*.so .mypy_cache .pytest_cache .ruff_cache .hypothesis
