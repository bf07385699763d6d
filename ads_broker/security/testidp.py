"""A small OpenID Connect identity provider for the OAUTHBEARER tests and ``make compat`` (0126):
a token endpoint and a JWKS endpoint on 127.0.0.1, in a thread of the caller's process.

- ``POST /token``: the client_credentials grant with HTTP Basic client authentication, as
  librdkafka's ``sasl.oauthbearer.method=oidc`` calls it; ``GET /token?...`` with ``Metadata: true``
  is the Azure IMDS form (``sasl.oauthbearer.metadata.authentication.type=azure_imds``), which needs
  ``api-version``, ``resource`` and ``client_id`` (librdkafka's 0126 expects a refusal without them).
- ``POST /expired`` issues an expired token, ``POST /invalid`` something that is no JWT
  (0126's ``EXPIRED_TOKEN_OIDC_URL`` and ``INVALID_OIDC_URL``, as trivup's OAuth server serves them).
- ``GET /jwks``: the public keys.

Keys are generated per instance with ``cryptography`` (never committed, as :mod:`testcerts`);
tokens are RS256 JWTs signed with PyJWT, with ``sub`` and ``client_id`` claims. The caller changes
what the next token looks like through the attributes (lifetime, audience, a rotated key) and
reads how many tokens were issued.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm


@dataclass
class SigningKey:
    kid: str
    private: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048))

    def jwk(self) -> dict[str, Any]:
        key = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        return {**key, "kid": self.kid, "use": "sig", "alg": "RS256"}

    def sign(self, claims: dict[str, Any], kid: str | None = None) -> str:
        return jwt.encode(claims, self.private, algorithm="RS256", headers={"kid": kid or self.kid})


class IdentityProvider:
    """``/token`` and ``/jwks``; ``clients`` maps client id -> (secret, subject of its tokens)."""

    def __init__(self, issuer_suffix: str = "", audience: str = "ads-broker") -> None:
        self.key = SigningKey("k1-" + uuid.uuid4().hex[:6])
        self.published: list[SigningKey] = [self.key]
        self.audience = audience
        self.lifetime_s = 3600.0
        self.extra_claims: dict[str, Any] = {}
        self.clients: dict[str, tuple[str, str]] = {}
        self.tokens_issued = 0
        self.jwks_fetches = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.issuer = f"http://127.0.0.1:{self.port}{issuer_suffix}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="idp", daemon=True)

    @property
    def token_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    @property
    def jwks_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/jwks"

    def __enter__(self) -> IdentityProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def claims(self, subject: str, **overrides: Any) -> dict[str, Any]:
        now = time.time()
        return {"iss": self.issuer, "aud": self.audience, "sub": subject, "client_id": subject, "iat": int(now),
                "exp": int(now + self.lifetime_s), "jti": uuid.uuid4().hex, **self.extra_claims, **overrides}

    def token(self, subject: str, **overrides: Any) -> str:
        return self.key.sign(self.claims(subject, **overrides))

    def rotate(self, keep_old: bool = False) -> SigningKey:
        """Sign from now on with a new key (new kid), published in the JWKS."""
        new = SigningKey("k2-" + uuid.uuid4().hex[:6])
        self.published = [*(self.published if keep_old else []), new]
        self.key = new
        return new

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path == "/token" and self.headers.get("Metadata") == "true":
                    return self._azure_imds(parse_qs(url.query))
                if url.path != "/jwks":
                    return self._json(404, {"error": "not_found"})
                with idp._lock:
                    idp.jwks_fetches += 1
                    keys = [k.jwk() for k in idp.published]
                self._json(200, {"keys": keys})

            def _azure_imds(self, query: dict[str, list[str]]) -> None:
                missing = [k for k in ("api-version", "resource", "client_id") if not query.get(k)]
                if missing:
                    return self._json(400, {"error": "invalid_request", "error_description": f"missing {missing}"})
                self._issue(idp.token(query["client_id"][0]))

            def _issue(self, token: str) -> None:
                with idp._lock:
                    idp.tokens_issued += 1
                self._json(200, {"access_token": token, "token_type": "bearer", "expires_in": int(idp.lifetime_s)})

            def do_POST(self) -> None:
                if self.path not in ("/token", "/expired", "/invalid"):
                    return self._json(404, {"error": "not_found"})
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                basic = self.headers.get("Authorization", "")
                client_id, _, secret = (base64.b64decode(basic[6:]).decode() if basic.startswith("Basic ")
                                        else ":").partition(":")
                known = idp.clients.get(client_id)
                if form.get("grant_type") != ["client_credentials"] or known is None or known[0] != secret:
                    return self._json(401, {"error": "invalid_client"})
                if self.path == "/invalid":
                    return self._json(200, {"access_token": "not-a-jwt", "token_type": "bearer", "expires_in": 60})
                now = int(time.time())
                self._issue(idp.token(known[1], **({"iat": now - 7200, "exp": now - 3600}
                                                   if self.path == "/expired" else {})))

        return Handler
