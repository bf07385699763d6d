#!/usr/bin/env bash
# Fetch librdkafka's source from the npm package @confluentinc/kafka-javascript (which bundles the
# full librdkafka tree, tests/ included, under deps/librdkafka) and build its test-runner.
# Everything lands under $COMPAT_CACHE (default: <repo>/.compat-cache, git-ignored); a second run
# finds the stamp file and does nothing. Prints the librdkafka source directory on stdout (last line).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
pkg_version=${COMPAT_NPM_VERSION:-1.10.1}   # bundles librdkafka 2.15.1
cache=${COMPAT_CACHE:-$repo/.compat-cache}
root=$cache/kafka-javascript-$pkg_version
src=$root/package/deps/librdkafka
# The stamp names the build flavour: a cache built before SSL/SASL (.built) or before curl
# (.built-ssl-sasl) is rebuilt.
stamp=$root/.built-ssl-sasl-curl
log=$root/build.log
jobs=${COMPAT_JOBS:-$(nproc 2>/dev/null || echo 2)}

if [[ -f $stamp && -x $src/tests/test-runner ]]; then
  echo "$src"
  exit 0
fi

mkdir -p "$root"
tgz=$root/kafka-javascript-$pkg_version.tgz
if [[ ! -s $tgz ]]; then
  # npm view gives the registry's own tarball address and checksum; curl fetches it, sha1 checks it.
  url=$(npm view "@confluentinc/kafka-javascript@$pkg_version" dist.tarball)
  sha=$(npm view "@confluentinc/kafka-javascript@$pkg_version" dist.shasum)
  echo "compat: fetching $url" >&2
  curl -sSfL --retry 3 -o "$tgz.part" "$url"
  echo "$sha  $tgz.part" | sha1sum -c --quiet - >&2
  mv "$tgz.part" "$tgz"
fi
if [[ ! -f $src/tests/Makefile ]]; then
  rm -rf "$root/package"
  tar xzf "$tgz" -C "$root"
  [[ -f $src/tests/Makefile && -f $src/tests/test.c ]] || {
    echo "compat: $tgz has no deps/librdkafka/tests tree; pick another COMPAT_NPM_VERSION" >&2
    exit 2
  }
fi

echo "compat: building librdkafka and its test-runner in $src (log: $log)" >&2
start=$(date +%s)
(
  # `set -e` does not apply inside a subshell followed by ||, hence the && chain.
  # With OpenSSL (0097 SSL verification, 0064) and librdkafka's built-in SASL PLAIN and SCRAM
  # (0135, 0142; SCRAM needs OpenSSL). --disable-sasl only leaves out Cyrus SASL (GSSAPI/Kerberos,
  # which ads-broker does not offer). libcurl (libcurl4-openssl-dev) gives SASL/OAUTHBEARER's OIDC
  # token fetch (sasl.oauthbearer.method=oidc, 0126). RapidJSON (rapidjson-dev, compat/compat.mk's
  # compat-apt-deps) lets 0053 and 0110 check the stats JSON.
  cd "$src" &&
  ./configure --enable-ssl --enable-curl --disable-sasl --disable-gssapi --disable-lz4-ext &&
  for feature in WITH_SSL WITH_SASL_SCRAM WITH_SASL_OAUTHBEARER WITH_CURL WITH_OAUTHBEARER_OIDC WITH_RAPIDJSON; do
    grep -q "^#define $feature 1" config.h || { echo "compat: configure left out $feature" >&2; exit 1; }
  done &&
  make -j"$jobs" libs &&
  make -j"$jobs" -C tests build
) >"$log" 2>&1 || { echo "compat: build failed, see $log" >&2; tail -30 "$log" >&2; exit 1; }
touch "$stamp"
echo "compat: built in $(( $(date +%s) - start ))s" >&2
echo "$src"
