"""TLS material, SASL users and per-test client settings for the suite's security tests.

librdkafka's CI runs these tests against trivup clusters started with ``--ssl`` / ``--sasl``: the
broker gets an SSL listener that requires client certificates (``ssl.client.auth=required``) and
a SASL listener, and trivup writes the client's ``security.protocol``, ``ssl.*`` and ``sasl.*``
into test.conf and points the ``SSL_*`` environment variables at the same client key in every
encoding (PEM, DER, PKCS#12). :class:`SecurityFixture` does the same for ads-broker: a CA, a
server certificate for 127.0.0.1/localhost and a client certificate, generated per run by
:mod:`ads_broker.security.testcerts` (as tests/integration/broker/test_security.py's are; no key is
committed).

Which test talks to which listener (:data:`SECURITY_TESTS`):

- 0097 (SSL certificate verification) on the SSL listener with a client certificate, mTLS required;
- 0135 (SASL credentials) and 0142 (re-authentication, KIP-368) on the SASL_SSL listener with
  SCRAM-SHA-256; the broker's ``connections.max.reauth.ms`` is what 0142 reads with
  DescribeConfigs to size its waits (0 would make it skip itself).
- 0126 (SASL/OAUTHBEARER with an OIDC token endpoint) on the SASL_SSL listener with OAUTHBEARER
  and ``sasl.oauthbearer.method=oidc``: the token endpoint is
  :class:`~ads_broker.security.testidp.IdentityProvider`, run in compat/run.py's process for the
  whole run (``VALID_OIDC_URL``, ``EXPIRED_TOKEN_OIDC_URL``, ``INVALID_OIDC_URL``, as trivup's OAuth
  server); the listener checks its tokens against its JWKS (KIP-768's validator).
- 0142's OAUTHBEARER subtests (``do_test_oauthbearer``: librdkafka's unsecured tokens,
  ``principal=admin scope=requiredScope``, a token lifetime of half the session) in a pass of their
  own on a SASL_PLAINTEXT listener with Kafka's unsecured validator (single broker only:
  :data:`OAUTHBEARER_PASSES`).

Every other test keeps the PLAINTEXT listener.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ads_broker.security import testcerts
from ads_broker.security.oauthbearer import JWKS_VALIDATOR_CLASSES
from ads_broker.security.testidp import IdentityProvider

#: test number -> the listener (security protocol) its test.conf names
SECURITY_TESTS = {"0097": "SSL", "0126": "SASL_SSL", "0135": "SASL_SSL", "0142": "SASL_SSL"}
#: the tests whose client logs in with OAUTHBEARER (OIDC) instead of SCRAM
OIDC_TESTS = frozenset({"0126"})
OIDC_CLIENT_ID = "rdkafka-test-oidc"
#: test number -> subtests run once more with an OAUTHBEARER (unsecured token) client on SASL_PLAINTEXT
OAUTHBEARER_PASSES = {"0142": ("do_test_oauthbearer:",)}
UNSECURED_JAAS = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                  'unsecuredValidatorRequiredScope="requiredScope";')

SASL_USER = "rdkafka-test"
SASL_MECHANISM = "SCRAM-SHA-256"
#: short enough that 0142's fifteen cases (each a little over one lifetime) fit its timeout
REAUTH_MS = 10000
#: the organization of every certificate's subject
ORG = "ads-compat"


@dataclass(frozen=True)
class SecurityFixture:
    """The files one run's brokers and clients share, under ``directory``."""

    directory: Path
    password: str  # the client key's (ssl.key.password, SSL_password) and the SASL user's
    idp: IdentityProvider  # the OIDC token endpoint and JWKS (0126), serving until close()

    @classmethod
    def create(cls, directory: Path) -> SecurityFixture:
        password = "compat-" + secrets.token_hex(8)
        ca, ca_key = testcerts.self_signed_ca("compat-ca", ORG, valid_days=2)
        server_key, client_key = testcerts.new_key(), testcerts.new_key()
        server = testcerts.issue(testcerts.name("localhost", ORG), server_key, ca.subject, ca_key, san=True,
                                 valid_days=2)
        client = testcerts.issue(testcerts.name("rdkafka-test-client", ORG), client_key, ca.subject, ca_key,
                                 valid_days=2)
        enc = password.encode()
        testcerts.write_private(directory, {
            "ca.pem": testcerts.pem(ca),
            "ca.der": testcerts.der(ca),
            "server.pem": testcerts.pem(server) + testcerts.pem_key(server_key),
            "client.pem": testcerts.pem(client),
            "client.der": testcerts.der(client),
            # PEM keys encrypted with ssl.key.password as trivup's are; DER ones cannot be
            # (librdkafka reads them with d2i_PrivateKey_bio).
            "client.key": testcerts.pem_key(client_key, enc),
            "client.key.der": testcerts.der_key(client_key),
            "client.p12": testcerts.pkcs12_bundle(b"client", client_key, client, [ca], enc),
        })
        idp = IdentityProvider().__enter__()
        idp.clients = {OIDC_CLIENT_ID: (password, OIDC_CLIENT_ID)}
        return cls(directory, password, idp)

    def close(self) -> None:
        self.idp.__exit__(None, None, None)

    def path(self, name: str) -> str:
        return str(self.directory / name)

    def broker_overrides(self, ports: dict[str, int]) -> tuple[str, ...]:
        """``--override`` values for a broker with a PLAINTEXT, an SSL, a SASL_SSL and (when in
        ``ports``) a SASL_PLAINTEXT listener, the last with OAUTHBEARER and the unsecured validator."""
        unsecured = ("listener.name.sasl_plaintext.sasl.enabled.mechanisms=OAUTHBEARER",
                     f"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config={UNSECURED_JAAS}")
        return ("listeners=" + ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
                *self.listener_settings(), *(unsecured if "SASL_PLAINTEXT" in ports else ()))

    def listener_settings(self) -> tuple[str, ...]:
        """The SSL and SASL_SSL listeners' settings, without the listeners themselves (``cluster up``
        chooses each broker's ports: ``--listener SSL --listener SASL_SSL``)."""
        return (
            f"ssl.keystore.location={self.path('server.pem')}",
            f"ssl.truststore.location={self.path('ca.pem')}",
            # trivup's --ssl: client certificates required on the SSL listener (0097's
            # SSL_client_auth=required); on SASL_SSL the SASL login authenticates, as in Kafka,
            # where ssl.client.auth only applies to SASL_SSL when set for that listener (KIP-684).
            "listener.name.ssl.ssl.client.auth=required",
            "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            f"connections.max.reauth.ms={REAUTH_MS}",
            # OAUTHBEARER on SASL_SSL only, its tokens checked against the run's identity provider (0126)
            "listener.name.sasl_ssl.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
            f"listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class={sorted(JWKS_VALIDATOR_CLASSES)[0]}",
            f"sasl.oauthbearer.jwks.endpoint.url={self.idp.jwks_url}",
            f"sasl.oauthbearer.expected.audience={self.idp.audience}",
            f"sasl.oauthbearer.expected.issuer={self.idp.issuer}",
        )

    def add_user(self, data_dir: Path) -> None:
        """The SASL user 0135/0142 log in as, in a broker data dir (before the broker starts)."""
        self._users_add("--data-dir", str(data_dir))

    def _users_add(self, *where: str) -> None:
        env = {**os.environ, "ADS_BROKER_USER_PASSWORD": self.password}
        out = subprocess.run([sys.executable, "-m", "ads_broker", "users", "add", SASL_USER, *where],
                             capture_output=True, text=True, env=env, timeout=120, check=False)
        if out.returncode != 0:
            raise SystemExit(f"compat: ads-broker users add failed: {out.stderr.strip()}")

    def add_cluster_user(self, zookeeper_connect: str) -> None:
        """The same user for a cluster: SCRAM credentials live in its ZooKeeper, for every broker."""
        self._users_add("--zookeeper-connect", zookeeper_connect)

    def client_conf(self, protocol: str, number: str = "") -> str:
        """test.conf lines for a client of the ``protocol`` listener (test ``number``)."""
        lines = [f"security.protocol={protocol.lower()}", f"ssl.ca.location={self.path('ca.pem')}"]
        if protocol == "SASL_PLAINTEXT":  # OAUTHBEARER_PASSES: librdkafka's unsecured tokens
            return ("security.protocol=sasl_plaintext\nsasl.mechanism=OAUTHBEARER\n"
                    "sasl.oauthbearer.config=principal=admin scope=requiredScope\n")
        if number in OIDC_TESTS:
            # trivup's --oidc: the test sets sasl.oauthbearer.token.endpoint.url from VALID_OIDC_URL & co.
            lines += ["sasl.mechanism=OAUTHBEARER", "sasl.oauthbearer.method=oidc",
                      f"sasl.oauthbearer.client.id={OIDC_CLIENT_ID}", f"sasl.oauthbearer.client.secret={self.password}",
                      f"sasl.oauthbearer.token.endpoint.url={self.idp.token_url}"]
        elif protocol == "SSL":
            lines += [f"ssl.certificate.location={self.path('client.pem')}",
                      f"ssl.key.location={self.path('client.key')}",
                      f"ssl.key.password={self.password}"]
        else:
            lines += [f"sasl.mechanism={SASL_MECHANISM}", f"sasl.username={SASL_USER}",
                      f"sasl.password={self.password}"]
        return "".join(line + "\n" for line in lines)

    def env(self) -> dict[str, str]:
        """trivup's ``SSL_*`` variables (0097 loads the same client key in each encoding)."""
        return {
            "SSL_pkcs": self.path("client.p12"),
            "SSL_pub_der": self.path("client.der"),
            "SSL_priv_der": self.path("client.key.der"),
            "SSL_ca_der": self.path("ca.der"),
            "SSL_pub_pem": self.path("client.pem"),
            "SSL_priv_pem": self.path("client.key"),
            "SSL_all_cas_pem": self.path("ca.pem"),
            "SSL_password": self.password,
            "SSL_client_auth": "required",
            "VALID_OIDC_URL": self.idp.token_url,
            "EXPIRED_TOKEN_OIDC_URL": self.idp.token_url.replace("/token", "/expired"),
            "INVALID_OIDC_URL": self.idp.token_url.replace("/token", "/invalid"),
        }
