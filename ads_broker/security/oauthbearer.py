"""SASL/OAUTHBEARER on the server side (RFC 7628, Kafka's KIP-255 and KIP-768).

The client sends one message, ``n,[a=<authzid>],\\x01auth=Bearer <token>\\x01[key=value\\x01...]\\x01``
(Kafka's ``OAuthBearerClientInitialResponse``). The token is checked by one of two validators,
chosen per listener as Kafka chooses its server callback handler:

* :class:`JwksTokenValidator` (KIP-768's ``OAuthBearerValidatorCallbackHandler``): a signed JWT,
  its signature checked with PyJWT against the keys published at
  ``sasl.oauthbearer.jwks.endpoint.url`` (:class:`JwksCache`: fetched off the event loop, refreshed
  every ``sasl.oauthbearer.jwks.endpoint.refresh.ms``, and at once, rate-limited, for an unknown
  ``kid``), ``exp`` and ``iat`` required, audience and issuer when configured.
* :class:`UnsecuredTokenValidator` (Kafka's default ``OAuthBearerUnsecuredValidatorCallbackHandler``):
  an unsigned JWS (``alg: none``), for tests only; its options come from the listener's
  ``OAuthBearerLoginModule`` JAAS entry.

As Kafka's ``OAuthBearerSaslServer``: a refused token is answered with the JSON error challenge
``{"status":"invalid_token"}`` (``insufficient_scope`` with the missing ``scope``); the client
answers ``%x01`` and gets SASL_AUTHENTICATION_FAILED. A message that is not RFC 7628's fails at
once with Kafka's generic text. The principal is ``User:<subject claim>``; the session lifetime
(KIP-368) is what is left of the token. No token, nor any part of one, is ever logged or put in a
message: reasons name claims and expected values only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import jwt

OAUTHBEARER = "OAUTHBEARER"
#: Kafka's class names for the validators (``sasl.server.callback.handler.class``).
JWKS_VALIDATOR_CLASSES = frozenset({
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerValidatorCallbackHandler",  # 3.1-3.3
})
UNSECURED_VALIDATOR_CLASS = \
    "org.apache.kafka.common.security.oauthbearer.internals.unsecured.OAuthBearerUnsecuredValidatorCallbackHandler"
LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
#: The asymmetric algorithms a JWKS key may verify (never ``none``, never HMAC: a public key must not
#: become an HMAC secret).
ALGORITHMS_BY_KEY_TYPE = {"RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
                          "EC": ("ES256", "ES384", "ES512"), "OKP": ("EdDSA",)}
#: An unknown ``kid`` makes the cache fetch the JWKS at once, but at most once in this many seconds
#: (Kafka's RefreshingHttpsJwks waits 60 s per missing kid; one global bound is simpler and as safe).
UNKNOWN_KID_REFRESH_INTERVAL_S = 10.0
MAX_KID_LENGTH = 256
MAX_JWKS_BYTES = 1 << 20
_GENERIC_FAILURE = "Authentication failed during {} due to invalid credentials with SASL mechanism OAUTHBEARER"
_AUTH_PATTERN = re.compile(r"(?P<scheme>[\w]+)[ ]+(?P<token>[-_.a-zA-Z0-9]+)")
_KEY_PATTERN = re.compile(r"[A-Za-z]+")
_VALUE_PATTERN = re.compile(r"[\x21-\x7E \t\r\n]+")


class TokenValidationError(Exception):
    """A token refused: ``status`` is RFC 6750's error code for the challenge (``invalid_token`` or
    ``insufficient_scope``), ``scope`` the missing scope; ``str()`` the reason, without the token."""

    def __init__(self, reason: str, status: str = "invalid_token", scope: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.scope = scope

    def challenge(self) -> bytes:
        """Kafka's ``OAuthBearerSaslServer.jsonErrorResponse``, byte for byte."""
        body = f'{{"status":"{self.status}"'
        if self.scope is not None:
            body += f', "scope":"{self.scope}"'
        return (body + "}").encode()


class MalformedClientResponseError(Exception):
    """The client's message is not RFC 7628's: refused at once with Kafka's generic text."""


@dataclass(frozen=True, slots=True)
class OAuthBearerToken:
    principal_name: str
    lifetime_ms: int  # the expiry, ms since the epoch (Kafka's OAuthBearerToken.lifetimeMs)
    scope: frozenset[str]


class TokenValidator(Protocol):
    async def validate(self, token: str) -> OAuthBearerToken: ...


@dataclass(frozen=True, slots=True)
class ClientInitialResponse:
    token: str
    authorization_id: str
    extensions: Mapping[str, str]


def parse_client_initial_response(message: bytes) -> ClientInitialResponse:
    """Kafka's ``OAuthBearerClientInitialResponse``: GS2 header, then ``key=value`` pairs separated
    by ``%x01``, with ``auth=Bearer <token>`` required."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedClientResponseError("not UTF-8") from None
    if not text.startswith("n,") or not text.endswith("\x01\x01"):
        raise MalformedClientResponseError("Invalid OAUTHBEARER client first message")
    authzid_part, sep, rest = text[2:].partition(",")
    if not sep or (authzid_part and not authzid_part.startswith("a=")):
        raise MalformedClientResponseError("Invalid OAUTHBEARER client first message: bad GS2 header")
    pairs: dict[str, str] = {}
    for pair in rest[1:-2].split("\x01") if rest.startswith("\x01") else ["\0"]:
        key, eq, value = pair.partition("=")
        if not eq or not _KEY_PATTERN.fullmatch(key) or (value and not _VALUE_PATTERN.fullmatch(value)):
            raise MalformedClientResponseError("Invalid OAUTHBEARER client first message: bad key/value pair")
        pairs[key] = value
    auth = pairs.pop("auth", None)
    match = _AUTH_PATTERN.fullmatch(auth or "")
    if match is None:
        raise MalformedClientResponseError("Invalid OAUTHBEARER client first message: no auth=Bearer <token>")
    if match["scheme"].lower() != "bearer":
        raise MalformedClientResponseError("Invalid scheme in OAuth token auth")
    return ClientInitialResponse(match["token"], authzid_part[2:], pairs)


class OAuthBearerSaslServer:
    """One connection's OAUTHBEARER exchange (:class:`ads_broker.security.scram.SaslServer`'s
    interface, but :meth:`step` is a coroutine: a JWKS refresh may run while it waits)."""

    def __init__(self, validator: TokenValidator, *, reauthentication: bool = False) -> None:
        from ads_broker.security.scram import SaslAuthenticationError

        self._failure = SaslAuthenticationError
        self.mechanism = OAUTHBEARER
        self.validator = validator
        self.reauthentication = reauthentication
        self.principal: str | None = None
        self.user = ""
        #: The token's expiry (ms since the epoch) once authenticated: bounds the session (KIP-368).
        self.credential_expiration_ms: int | None = None
        self._error: TokenValidationError | None = None
        self.reason = ""

    async def step(self, message: bytes) -> bytes:
        if message == b"\x01" and self._error is not None:
            # The client acknowledged our error challenge: now the failure (Kafka sends the JSON as text).
            raise self._failure(self._error.challenge().decode() + f": {self._error}")
        self._error = None
        try:
            initial = parse_client_initial_response(message)
        except MalformedClientResponseError as e:
            self.reason = str(e)
            raise self._failure(_GENERIC_FAILURE.format(
                "re-authentication" if self.reauthentication else "authentication")) from None
        try:
            token = await self.validator.validate(initial.token)
        except TokenValidationError as e:
            self._error, self.reason = e, str(e)
            return e.challenge()
        if initial.authorization_id and initial.authorization_id != token.principal_name:
            raise self._failure(f"Authentication failed: Client requested an authorization id "
                                f"({initial.authorization_id[:128]}) that is different from the token's "
                                f"principal name ({token.principal_name})")
        self.user = token.principal_name
        self.credential_expiration_ms = token.lifetime_ms
        self.principal = f"User:{token.principal_name}"
        return b""


# -- claims shared by both validators ---------------------------------------------------------------

def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _scope(claims: Mapping[str, Any], name: str) -> frozenset[str]:
    """Kafka's rule: a string claim is one scope (trimmed), a list is many."""
    value = claims.get(name)
    if isinstance(value, str):
        return frozenset({value.strip()}) if value.strip() else frozenset()
    if isinstance(value, list):
        return frozenset(str(v).strip() for v in value if v is not None and str(v).strip())
    return frozenset()


def _number(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenValidationError(f"The '{name}' claim was not of type Number")
    return float(value)


# -- the unsecured validator ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class UnsecuredTokenValidator:
    """Kafka's ``OAuthBearerUnsecuredValidatorCallbackHandler``: unsigned JWS (``alg: none``),
    principal claim required, ``exp`` required and not passed, ``iat`` (optional) not in the
    future, ``exp`` after ``iat``, and every required scope present. For tests only: anyone can
    write such a token for any principal."""

    principal_claim_name: str = "sub"
    scope_claim_name: str = "scope"
    required_scope: tuple[str, ...] = ()
    allowable_clock_skew_ms: int = 0
    clock: Callable[[], float] = time.time

    @classmethod
    def from_jaas_options(cls, options: Mapping[str, str]) -> UnsecuredTokenValidator:
        """``unsecuredValidator*`` options of the listener's OAuthBearerLoginModule entry."""
        skew = options.get("unsecuredValidatorAllowableClockSkewMs", "0").strip() or "0"
        try:
            skew_ms = int(skew)
        except ValueError:
            raise ValueError(f"unsecuredValidatorAllowableClockSkewMs={skew!r} is not an integer") from None
        if skew_ms < 0:
            raise ValueError("unsecuredValidatorAllowableClockSkewMs must not be negative")
        principal = options.get("unsecuredValidatorPrincipalClaimName", "sub").strip() or "sub"
        scope = options.get("unsecuredValidatorScopeClaimName", "scope").strip() or "scope"
        required = tuple(s for s in options.get("unsecuredValidatorRequiredScope", "").split() if s)
        return cls(principal, scope, required, skew_ms)

    async def validate(self, token: str) -> OAuthBearerToken:
        if ".." in token:
            raise TokenValidationError("Malformed compact serialization contains '..'")
        parts = token.split(".")
        if len(parts) != 3:
            raise TokenValidationError("Unsecured JWS compact serializations must have 3 dot-separated "
                                       "Base64URL-encoded values")
        header, claims = _json_part(parts[0]), _json_part(parts[1])
        if header.get("alg") != "none":
            raise TokenValidationError("Unsecured JWS must have 'none' for an algorithm")
        if parts[2]:
            raise TokenValidationError("Unsecured JWS must not contain a digital signature")
        scope = _scope(claims, self.scope_claim_name)
        exp = _number(claims, "exp")
        if exp is None:
            raise TokenValidationError("No expiration time in JWT")
        principal = claims.get(self.principal_claim_name)
        if not isinstance(principal, str) or not principal.strip():
            raise TokenValidationError(f"No principal name in JWT claim: {self.principal_claim_name}")
        now, skew = self.clock(), self.allowable_clock_skew_ms / 1000
        iat = _number(claims, "iat")
        if iat is not None and iat > now + skew:
            raise TokenValidationError(f"the token was issued in the future (iat {_iso(iat)}, now {_iso(now)}, "
                                       f"allowable clock skew {self.allowable_clock_skew_ms} ms)")
        if now - skew >= exp:
            raise TokenValidationError(f"the token expired at {_iso(exp)} (now {_iso(now)}, allowable clock skew "
                                       f"{self.allowable_clock_skew_ms} ms)")
        if iat is not None and exp <= iat:
            raise TokenValidationError("the token's expiration time is not after its issued-at time")
        for element in self.required_scope:
            if element not in scope:
                raise TokenValidationError(
                    f"The provided scope ({sorted(scope)}) was missing a required scope ({element})",
                    status="insufficient_scope", scope=f"[{', '.join(self.required_scope)}]")
        return OAuthBearerToken(principal, round(exp * 1000), scope)


def _json_part(part: str) -> dict[str, Any]:
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise TokenValidationError("malformed Base64 URL encoded value") from None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise TokenValidationError("malformed JSON") from None
    if not isinstance(value, dict):
        raise TokenValidationError("malformed JSON: not an object")
    return value


# -- the JWKS validator (KIP-768) -----------------------------------------------------------------------

class JwksCache:
    """The keys published at a JWKS URL, by ``kid``. Fetched with urllib in a worker thread, never
    on the event loop; :meth:`run` refreshes them every ``refresh_ms``; :meth:`key` refreshes at
    once for a ``kid`` it does not have, at most once every :data:`UNKNOWN_KID_REFRESH_INTERVAL_S`."""

    def __init__(self, url: str, refresh_ms: int, timeout_s: float = 10.0,
                 log: Callable[..., None] | None = None) -> None:
        self.url = url
        self.refresh_ms = refresh_ms
        self.timeout_s = timeout_s
        self._log = log
        #: kid -> (key, the algorithm the JWK declares, if it does)
        self._keys: dict[str, tuple[jwt.PyJWK, str | None]] = {}
        self._fetch_lock = asyncio.Lock()
        self._last_unknown_refresh = 0.0
        self._thread_lock = threading.Lock()
        self.fetches = 0

    def _fetch(self) -> dict[str, tuple[jwt.PyJWK, str | None]]:
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})  # noqa: S310 (checked scheme)
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
            body = response.read(MAX_JWKS_BYTES + 1)
        if len(body) > MAX_JWKS_BYTES:
            raise ValueError(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes")
        keys: dict[str, tuple[jwt.PyJWK, str | None]] = {}
        for raw in json.loads(body).get("keys", []):
            if not isinstance(raw, dict) or raw.get("use", "sig") != "sig" or raw.get("kty") not in \
                    ALGORITHMS_BY_KEY_TYPE:
                continue
            try:
                key = jwt.PyJWK(raw)
            except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
                continue  # a key of a type PyJWT does not verify with: skipped, as jose4j skips it
            alg = raw.get("alg")
            keys[str(raw.get("kid", ""))] = key, alg if isinstance(alg, str) else None
        return keys

    async def refresh(self) -> None:
        async with self._fetch_lock:
            try:
                keys = await asyncio.to_thread(self._fetch)
            except (OSError, ValueError, urllib.error.URLError) as e:
                if self._log is not None:
                    self._log("JWKS refresh failed; keeping the keys fetched before", url=self.url,
                              error=str(e)[:200], keys=len(self._keys))
                return
            self.fetches += 1
            self._keys = keys

    async def run(self) -> None:
        """The periodic refresh (Kafka's RefreshingHttpsJwks), until cancelled."""
        while True:
            await self.refresh()
            await asyncio.sleep(self.refresh_ms / 1000)

    async def key(self, kid: str) -> tuple[jwt.PyJWK, str | None] | None:
        if kid in self._keys:
            return self._keys[kid]
        now = time.monotonic()
        if len(kid) <= MAX_KID_LENGTH and (not self._last_unknown_refresh
                                           or now - self._last_unknown_refresh >= UNKNOWN_KID_REFRESH_INTERVAL_S):
            self._last_unknown_refresh = now
            await self.refresh()
        return self._keys.get(kid)


@dataclass(frozen=True)
class JwksTokenValidator:
    """KIP-768's ``OAuthBearerValidatorCallbackHandler``: a JWT signed with a key of the JWKS (an
    asymmetric algorithm the key allows), ``exp`` and ``iat`` required and checked with
    ``clock_skew_s``, ``aud`` one of ``expected_audience`` and ``iss`` equal to ``expected_issuer``
    when those are set (a token with an ``aud`` and no expected audience is refused, as jose4j
    refuses it), the subject claim a non-blank string."""

    jwks: JwksCache
    expected_audience: tuple[str, ...] = ()
    expected_issuer: str = ""
    sub_claim_name: str = "sub"
    scope_claim_name: str = "scope"
    clock_skew_s: int = 30

    async def validate(self, token: str) -> OAuthBearerToken:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError as e:
            raise TokenValidationError(_pyjwt_reason(e)) from None
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in {a for algs in ALGORITHMS_BY_KEY_TYPE.values() for a in algs}:
            raise TokenValidationError(f"the token's algorithm {str(alg)[:16]!r} is not allowed (an asymmetric "
                                       "signature is required)")
        if not isinstance(kid, str):
            raise TokenValidationError("the token's header has no key id (kid)")
        found = await self.jwks.key(kid)
        if found is None:
            raise TokenValidationError(f"no key with key id (kid) {kid[:64]!r} in the JWKS at {self.jwks.url}")
        key, declared = found
        if (declared is not None and declared != alg) or alg not in ALGORITHMS_BY_KEY_TYPE.get(key.key_type or "", ()):
            raise TokenValidationError(f"the token's algorithm {alg} does not match its key {kid[:64]!r}")
        try:
            claims = jwt.decode(token, key.key, algorithms=[alg], audience=list(self.expected_audience) or None,
                                issuer=self.expected_issuer or None, leeway=self.clock_skew_s,
                                options={"require": ["exp", "iat"], "verify_nbf": True})
        except jwt.InvalidTokenError as e:
            raise TokenValidationError(_pyjwt_reason(e, self)) from None
        subject = claims.get(self.sub_claim_name)
        if not isinstance(subject, str) or not subject.strip():
            raise TokenValidationError(f"the token has no subject: the {self.sub_claim_name!r} claim is missing "
                                       "or not a non-blank string (sasl.oauthbearer.sub.claim.name)")
        return OAuthBearerToken(subject, round(float(claims["exp"]) * 1000), _scope(claims, self.scope_claim_name))


def _pyjwt_reason(e: Exception, validator: JwksTokenValidator | None = None) -> str:
    """A reason naming what failed, never a claim value the client could use to probe secrets."""
    if isinstance(e, jwt.ExpiredSignatureError):
        return "the token has expired (exp is in the past, beyond sasl.oauthbearer.clock.skew.seconds)"
    if isinstance(e, jwt.ImmatureSignatureError):
        return "the token is not yet valid (nbf or iat in the future)"
    if isinstance(e, jwt.InvalidAudienceError) and validator is not None:
        expected = ", ".join(validator.expected_audience) or "(no audience)"
        return f"the token's audience (aud) is not the expected audience {expected}"
    if isinstance(e, jwt.InvalidIssuerError) and validator is not None:
        return f"the token's issuer (iss) is not the expected issuer {validator.expected_issuer}"
    if isinstance(e, jwt.MissingRequiredClaimError):
        return f"the token has no {e.claim!r} claim, which is required"
    if isinstance(e, jwt.InvalidSignatureError):
        return "the token's signature does not verify with the JWKS key of its key id (kid)"
    if isinstance(e, jwt.DecodeError):
        return "malformed token (not a JWS compact serialization of a JSON claims set)"
    return f"invalid token: {type(e).__name__}"


# -- from the broker's settings ---------------------------------------------------------------------------

def validator_for_listener(config: Any, listener: str,
                           log: Callable[..., None] | None = None) -> tuple[TokenValidator, JwksCache | None]:
    """The OAUTHBEARER validator of one listener, from Kafka's settings (``config`` is a
    :class:`~ads_broker.config.BrokerConfig`): ``sasl.server.callback.handler.class`` names the JWKS
    validator, else the listener's ``OAuthBearerLoginModule`` JAAS entry gives the unsecured one its
    options. Neither is a ConfigError: OAUTHBEARER never accepts tokens without an explicit choice
    (Kafka, too, refuses to start without a JAAS entry for an enabled mechanism)."""
    from ads_broker.exceptions import ConfigError
    from ads_broker.security.sasl_client import parse_jaas_config

    def setting(name: str) -> Any:
        return config.mechanism_setting(listener, OAUTHBEARER, name)

    prefix = f"listener.name.{listener.lower()}.oauthbearer."
    handler = str(setting("sasl.server.callback.handler.class")).strip()
    if handler in JWKS_VALIDATOR_CLASSES:
        url = str(setting("sasl.oauthbearer.jwks.endpoint.url")).strip()
        if not url:
            raise ConfigError(f"listener {listener}: {handler} needs sasl.oauthbearer.jwks.endpoint.url (or "
                              f"{prefix}sasl.oauthbearer.jwks.endpoint.url): the identity provider's JWKS")
        cache = JwksCache(url, int(setting("sasl.oauthbearer.jwks.endpoint.refresh.ms")), log=log)
        audience = tuple(a.strip() for a in str(setting("sasl.oauthbearer.expected.audience")).split(",") if a.strip())
        return JwksTokenValidator(cache, audience, str(setting("sasl.oauthbearer.expected.issuer")).strip(),
                                  str(setting("sasl.oauthbearer.sub.claim.name")).strip() or "sub",
                                  str(setting("sasl.oauthbearer.scope.claim.name")).strip() or "scope",
                                  int(setting("sasl.oauthbearer.clock.skew.seconds"))), cache
    if handler and handler != UNSECURED_VALIDATOR_CLASS:
        raise ConfigError(f"listener {listener}: sasl.server.callback.handler.class={handler!r} is not supported; "
                          f"use {sorted(JWKS_VALIDATOR_CLASSES)[0]} (JWKS) or leave it empty for the unsecured "
                          "validator")
    jaas = config.listener_overrides.get(listener.upper(), {}).get("oauthbearer.sasl.jaas.config")
    if not jaas:
        raise ConfigError(
            f"listener {listener}: OAUTHBEARER is enabled but no token validator is configured: set "
            f"{prefix}sasl.server.callback.handler.class={sorted(JWKS_VALIDATOR_CLASSES)[0]} and "
            f"sasl.oauthbearer.jwks.endpoint.url (signed tokens), or, for tests only, {prefix}sasl.jaas.config="
            f"{LOGIN_MODULE} required; (Kafka's unsecured validator: unsigned tokens, anyone may claim any principal)")
    login = parse_jaas_config(str(jaas), f"{prefix}sasl.jaas.config")
    if login.module != LOGIN_MODULE:
        raise ConfigError(f"{prefix}sasl.jaas.config: {login.module} is not {LOGIN_MODULE}")
    try:
        return UnsecuredTokenValidator.from_jaas_options(login.options), None
    except ValueError as e:
        raise ConfigError(f"{prefix}sasl.jaas.config: {e}") from None
