"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), as Kafka serves them,
on the credential store: the data dir's on a single node (:mod:`ads_broker.security.scram`),
ZooKeeper's in cluster mode (:mod:`ads_broker.security.zk_store`), where a change made through one
broker reaches every broker.

As in Kafka, with an authorizer they need DESCRIBE / ALTER on the Cluster resource
(CLUSTER_AUTHORIZATION_FAILED); without one (``authorizer.class.name`` empty) any client may call them.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from kafka.protocol.admin import (
    AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsResponse,
)

from ads_broker.errors import (
    DUPLICATE_RESOURCE,
    RESOURCE_NOT_FOUND,
    UNACCEPTABLE_CREDENTIAL,
    UNKNOWN_SERVER_ERROR,
    UNSUPPORTED_SASL_MECHANISM,
)
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.security.acl import ALTER, CLUSTER, CLUSTER_NAME, DESCRIBE
from ads_broker.security.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    Credentials,
    ScramCredential,
)

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

async def store_write(ctx: HandlerContext, write: Callable[..., T], *args: Any) -> T:
    """Run an ACL or credential write. Single node: on the loop, as before (the data dir's file;
    writes stay in order). Cluster mode: on the ZooKeeper session's own writer threads
    (:meth:`ZkSecurity.write`), never the loop's default executor; refused at once while ZooKeeper
    is unreachable (ZooKeeperUnavailableError), else waiting at most a ZooKeeper session timeout
    (TimeoutError). The handlers answer either UNKNOWN_SERVER_ERROR with the reason, as Kafka's
    authorizer and admin manager answer a failed ZooKeeper write (``ApiError.fromThrowable``)."""
    if ctx.security is None:
        return write(*args)
    timeout_s = max(ctx.config.settings.zookeeper_session_timeout_ms / 1000, 1.0)
    return await ctx.security.write(write, *args, timeout_s=timeout_s)


T = TypeVar("T")

#: Kafka's ScramMechanism type ids on the wire.
MECHANISM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
_BY_ID = {v: k for k, v in MECHANISM_IDS.items()}


def _store(ctx: HandlerContext) -> Credentials:
    """The data dir's file on a single node; ZooKeeper in cluster mode (every broker sees a change)."""
    return ctx.credentials


async def handle_describe_user_scram_credentials(ctx: HandlerContext,
                                                 req: DecodedRequest) -> DescribeUserScramCredentialsResponse:
    R = DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult
    if denied := ctx.authorize(req, "describe_user_scram_credentials", DESCRIBE, CLUSTER, CLUSTER_NAME):
        return DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=denied,
                                                    error_message="Cluster authorization failed", results=[])
    users = _store(ctx).users()
    wanted = [u.name for u in req.body.users or []]
    names = wanted or sorted(users)
    results = []
    repeats = Counter(wanted)  # one count: ``wanted.count`` per name was N^2 on the loop (review s13, H1)
    for name in dict.fromkeys(names):
        if repeats[name] > 1:
            results.append(R(user=name, error_code=DUPLICATE_RESOURCE,
                             error_message=f"Cannot describe SCRAM credentials for the same user twice in a single "
                                           f"request: {name}", credential_infos=[]))
        elif name not in users:
            results.append(R(user=name, error_code=RESOURCE_NOT_FOUND,
                             error_message=f"Attempt to describe a user credential that does not exist: {name}",
                             credential_infos=[]))
        else:
            infos = [R.CredentialInfo(mechanism=MECHANISM_IDS[m], iterations=c.iterations)
                     for m, c in sorted(users[name].items())]
            results.append(R(user=name, error_code=0, error_message=None, credential_infos=infos))
    return DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=0, error_message=None,
                                                results=results)


async def handle_alter_user_scram_credentials(ctx: HandlerContext,
                                              req: DecodedRequest) -> AlterUserScramCredentialsResponse:
    R = AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult
    store = _store(ctx)
    body = req.body
    touched = [d.name for d in body.deletions] + [u.name for u in body.upsertions]
    if denied := ctx.authorize(req, "alter_user_scram_credentials", ALTER, CLUSTER, CLUSTER_NAME):
        return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=[
            R(user=name, error_code=denied, error_message="Cluster authorization failed")
            for name in dict.fromkeys(touched)])
    errors: dict[str, tuple[int, str]] = {}
    repeats = Counter(touched)
    for name in touched:
        if repeats[name] > 1:
            errors[name] = (DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
        elif not name:
            errors[name] = (UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
    existing = store.users()
    for d in body.deletions:
        mechanism = _BY_ID.get(d.mechanism)
        if d.name in errors:
            continue
        if mechanism is None:
            errors[d.name] = (UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
        elif mechanism not in existing.get(d.name, {}):
            errors[d.name] = (RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
    for u in body.upsertions:
        mechanism = _BY_ID.get(u.mechanism)
        if u.name in errors:
            continue
        if mechanism is None:
            errors[u.name] = (UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
        elif u.iterations < MIN_ITERATIONS:
            errors[u.name] = (UNACCEPTABLE_CREDENTIAL, "Too few iterations")
        elif u.iterations > MAX_ITERATIONS:
            errors[u.name] = (UNACCEPTABLE_CREDENTIAL, "Too many iterations")
        elif not u.salt or not u.salted_password:
            errors[u.name] = (UNACCEPTABLE_CREDENTIAL, "The salt and the salted password must not be empty")
    deletions = [(d.name, _BY_ID[d.mechanism]) for d in body.deletions if d.name not in errors]
    upsertions = []
    for u in body.upsertions:
        if u.name not in errors:
            mechanism = _BY_ID[u.mechanism]
            algorithm = SCRAM_MECHANISMS[mechanism]
            salted = bytes(u.salted_password)
            client_key = hmac.digest(salted, b"Client Key", algorithm)
            upsertions.append((u.name, mechanism, ScramCredential(
                bytes(u.salt), int(u.iterations), hashlib.new(algorithm, client_key).digest(),
                hmac.digest(salted, b"Server Key", algorithm))))

    changes: dict[str, tuple[list[str], dict[str, ScramCredential]]] = {}
    for name, mechanism in deletions:
        changes.setdefault(name, ([], {}))[0].append(mechanism)
    for name, mechanism, credential in upsertions:
        changes.setdefault(name, ([], {}))[1][mechanism] = credential
    if ctx.security is None:
        # Single node: the whole request in one write of the data dir's file, on a thread (it
        # fsyncs): one write per user on the loop made 1,000 upsertions 60 s of stall (review s13, H2).
        try:
            await asyncio.to_thread(store.alter_many, changes)
        except Exception as e:
            for name in changes:
                errors[name] = (UNKNOWN_SERVER_ERROR, f"credential not stored: {type(e).__name__}: {e}"[:300])
    else:
        # Cluster mode: a znode per user, each write on the ZooKeeper session's writer threads; one
        # user's deletions and upsertions in one write (nobody sees the state between them).
        for name, (user_deletions, user_upsertions) in changes.items():
            try:
                await store_write(ctx, store.alter, name, user_deletions, user_upsertions)
            except Exception as e:
                errors[name] = (UNKNOWN_SERVER_ERROR, f"credential not stored: {type(e).__name__}: {e}"[:300])
    results = []
    for name in dict.fromkeys(touched):
        code, message = errors.get(name, (0, None))
        if code:
            ctx.log_client_error(req, "alter_user_scram_credentials", None, error_code=code, user=name[:128],
                                 detail=message)
        results.append(R(user=name, error_code=code, error_message=message))
    return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)
