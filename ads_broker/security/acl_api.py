"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31), as Kafka serves them, on the
authorizer's ACLs (:mod:`ads_broker.security.acl`).

Kafka checks DESCRIBE (DescribeAcls) or ALTER (Create/DeleteAcls) on the Cluster resource; without
an authorizer it answers SECURITY_DISABLED (54), as here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import CreateAclsResponse, DeleteAclsResponse, DescribeAclsResponse

from ads_broker.errors import INVALID_REQUEST, SECURITY_DISABLED, UNKNOWN_SERVER_ERROR
from ads_broker.protocol.codec import DecodedRequest
from ads_broker.security.acl import ALTER, CLUSTER, CLUSTER_NAME, DESCRIBE, Acl, AclError, AclFilter
from ads_broker.security.users_api import store_write

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

NO_AUTHORIZER = "No Authorizer is configured on the broker (authorizer.class.name is empty)"


def _filter(f: object) -> AclFilter:
    get = f.__getattribute__
    return AclFilter(get("resource_type_filter"), get("resource_name_filter"), get("pattern_type_filter"),
                     get("principal_filter"), get("host_filter"), get("operation"), get("permission_type"))


async def handle_describe_acls(ctx: HandlerContext, req: DecodedRequest) -> DescribeAclsResponse:
    def fail(code: int, message: str) -> DescribeAclsResponse:
        return DescribeAclsResponse(throttle_time_ms=0, error_code=code, error_message=message, resources=[])

    if ctx.authorizer is None:
        ctx.log_client_error(req, "describe_acls", None, error_code=SECURITY_DISABLED)
        return fail(SECURITY_DISABLED, NO_AUTHORIZER)
    if code := ctx.authorize(req, "describe_acls", DESCRIBE, CLUSTER, CLUSTER_NAME):
        return fail(code, "Cluster authorization failed")
    flt = _filter(req.body)
    try:
        flt.validate()
    except AclError as e:
        ctx.log_client_error(req, "describe_acls", None, error_code=INVALID_REQUEST, detail=str(e))
        return fail(INVALID_REQUEST, str(e))
    by_resource: dict[tuple[int, str, int], list[Acl]] = {}
    for acl in ctx.authorizer.acls:
        if flt.matches(acl):
            by_resource.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(acl)
    R = DescribeAclsResponse.DescribeAclsResource
    return DescribeAclsResponse(throttle_time_ms=0, error_code=0, error_message=None, resources=[
        R(resource_type=rt, resource_name=name, pattern_type=pt, acls=[
            R.AclDescription(principal=a.principal, host=a.host, operation=a.operation, permission_type=a.permission)
            for a in acls])
        for (rt, name, pt), acls in by_resource.items()])


async def handle_create_acls(ctx: HandlerContext, req: DecodedRequest) -> CreateAclsResponse:
    R = CreateAclsResponse.AclCreationResult
    creations = list(req.body.creations)
    if ctx.authorizer is None:
        ctx.log_client_error(req, "create_acls", None, error_code=SECURITY_DISABLED)
        return CreateAclsResponse(throttle_time_ms=0, results=[
            R(error_code=SECURITY_DISABLED, error_message=NO_AUTHORIZER) for _ in creations])
    if code := ctx.authorize(req, "create_acls", ALTER, CLUSTER, CLUSTER_NAME):
        return CreateAclsResponse(throttle_time_ms=0, results=[
            R(error_code=code, error_message="Cluster authorization failed") for _ in creations])
    results = []
    valid = []
    for c in creations:
        acl = Acl(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host, c.operation,
                  c.permission_type)
        try:
            acl.validate()
            ctx.authorizer.check_storable(acl)
        except AclError as e:
            ctx.log_client_error(req, "create_acls", None, error_code=INVALID_REQUEST, detail=str(e))
            results.append(R(error_code=INVALID_REQUEST, error_message=str(e)))
            continue
        valid.append(acl)
        results.append(R(error_code=0, error_message=None))
    if valid:
        authorizer = ctx.authorizer
        try:  # cluster mode: a ZooKeeper write per resource, off the loop
            await store_write(ctx, authorizer.create, valid)
        except Exception as e:
            message = f"ACLs not stored: {type(e).__name__}: {e}"[:300]
            ctx.log_client_error(req, "create_acls", None, error_code=UNKNOWN_SERVER_ERROR, detail=message)
            results = [r if r.error_code else R(error_code=UNKNOWN_SERVER_ERROR, error_message=message)
                       for r in results]
    return CreateAclsResponse(throttle_time_ms=0, results=results)


async def handle_delete_acls(ctx: HandlerContext, req: DecodedRequest) -> DeleteAclsResponse:
    R = DeleteAclsResponse.DeleteAclsFilterResult
    filters = [_filter(f) for f in req.body.filters]
    if ctx.authorizer is None:
        ctx.log_client_error(req, "delete_acls", None, error_code=SECURITY_DISABLED)
        return DeleteAclsResponse(throttle_time_ms=0, filter_results=[
            R(error_code=SECURITY_DISABLED, error_message=NO_AUTHORIZER, matching_acls=[]) for _ in filters])
    if code := ctx.authorize(req, "delete_acls", ALTER, CLUSTER, CLUSTER_NAME):
        return DeleteAclsResponse(throttle_time_ms=0, filter_results=[
            R(error_code=code, error_message="Cluster authorization failed", matching_acls=[]) for _ in filters])
    bad: dict[int, str] = {}
    for i, f in enumerate(filters):
        try:
            f.validate()
        except AclError as e:
            bad[i] = str(e)
            ctx.log_client_error(req, "delete_acls", None, error_code=INVALID_REQUEST, detail=str(e))
    authorizer = ctx.authorizer
    valid = [f for i, f in enumerate(filters) if i not in bad]
    try:  # cluster mode: a ZooKeeper write per resource, off the loop
        removed = await store_write(ctx, authorizer.delete, valid)
    except Exception as e:
        message = f"ACLs not deleted: {type(e).__name__}: {e}"[:300]
        ctx.log_client_error(req, "delete_acls", None, error_code=UNKNOWN_SERVER_ERROR, detail=message)
        return DeleteAclsResponse(throttle_time_ms=0, filter_results=[
            R(error_code=INVALID_REQUEST if i in bad else UNKNOWN_SERVER_ERROR, error_message=bad.get(i, message),
              matching_acls=[]) for i in range(len(filters))])
    it = iter(removed)
    results = []
    for i in range(len(filters)):
        if i in bad:
            results.append(R(error_code=INVALID_REQUEST, error_message=bad[i], matching_acls=[]))
            continue
        results.append(R(error_code=0, error_message=None, matching_acls=[
            R.DeleteAclsMatchingAcl(error_code=0, error_message=None, resource_type=a.resource_type,
                                    resource_name=a.resource_name, pattern_type=a.pattern_type, principal=a.principal,
                                    host=a.host, operation=a.operation, permission_type=a.permission)
            for a in next(it)]))
    return DeleteAclsResponse(throttle_time_ms=0, filter_results=results)
