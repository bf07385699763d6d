# `make compat`: librdkafka's own integration suite against a fresh ads-broker (compat/run.py,
# docs/COMPATIBILITY.md). Included from the Makefile after the venv targets.
# librdkafka's source is fetched from npm (@confluentinc/kafka-javascript) and built once into
# .compat-cache/ (git-ignored; `make compat-clean` drops it). Knobs, all optional:
#   COMPAT_TESTS=0001,0045/noautocreate  run only these (excluded ones too when named)
#   COMPAT_SUBTESTS=DeleteGroups         only subtests whose name contains this (SUBTESTS)
#   COMPAT_TIMEOUT=1200                  wall-clock seconds per test number
#   COMPAT_MULTIPLIER=2                  the suite's test.timeout.multiplier
#   COMPAT_KAFKA_VERSION=3.2.0           TEST_KAFKA_VERSION (what ads-broker's ApiVersions match)
#   COMPAT_QUICK=1                       the runner's -Q (less data, skips non-quick subtests)
#   COMPAT_CLUSTER=3                     against `ads-broker cluster up` (3 brokers + ZooKeeper, SSL and SASL_SSL
#                                        listeners on each): 0103/0107/0111, 0142 with its consumer subtest
#   COMPAT_NPM_VERSION=1.10.1            the kafka-javascript release (bundles librdkafka 2.15.1)
export COMPAT_TESTS COMPAT_SUBTESTS COMPAT_QUICK COMPAT_CLUSTER COMPAT_TIMEOUT COMPAT_MULTIPLIER COMPAT_KAFKA_VERSION COMPAT_NPM_VERSION

.PHONY: compat compat-ci compat-clean compat-apt-deps

# What librdkafka's configure needs for the build compat/fetch_build.sh checks for: OpenSSL (SSL
# and SASL SCRAM: 0064, 0097, 0135, 0142), RapidJSON (the stats JSON checks of 0053 and 0110) and
# zstd (the codec, as in librdkafka's own CI builds), libcurl (the OIDC token fetch of SASL/OAUTHBEARER:
# 0126). Installed when a header is missing.
COMPAT_APT_PACKAGES := libssl-dev rapidjson-dev libzstd-dev libcurl4-openssl-dev
compat-apt-deps:
	@{ [ -e /usr/include/openssl/ssl.h ] && [ -e /usr/include/rapidjson/schema.h ] && [ -e /usr/include/zstd.h ] \
	  && [ -n "$$(ls /usr/include/*/curl/curl.h /usr/include/curl/curl.h 2>/dev/null)" ]; } || { \
	  SUDO=$$(command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends $(COMPAT_APT_PACKAGES); }

compat: compat-apt-deps $(VENV)/.test
	$(PY) compat/run.py

# The fixed subset CI runs after `make test` (compat/ci-subset says why these).
compat-ci: compat-apt-deps $(VENV)/.test
	$(PY) compat/run.py --subset compat/ci-subset

compat-clean:
	rm -rf .compat-cache
