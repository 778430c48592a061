"""Envoy's rate limit service protocol against damper-agentd, with the
stubs of the envoy-data-plane package (Envoy's published API), the
descriptors an Envoy ratelimit filter sends. Usage: envoy_rls.py HOST:PORT
"""
import sys

import grpc
from envoy_data_plane.envoy.extensions.common.ratelimit.v3 import RateLimitDescriptor, RateLimitDescriptorEntry
from envoy_data_plane.envoy.service.ratelimit.v3 import (
    RateLimitRequest, RateLimitResponseCode, RateLimitResponseRateLimitUnit, RateLimitServiceSyncStub)

stub = RateLimitServiceSyncStub(grpc.insecure_channel(sys.argv[1]))


def descriptor(*entries, hits=None):
    return RateLimitDescriptor(entries=[RateLimitDescriptorEntry(key=k, value=v) for k, v in entries],
                               hits_addend=hits)


def ask(*descriptors, hits=0):
    return stub.should_rate_limit(RateLimitRequest(domain="edge", descriptors=list(descriptors), hits_addend=hits))


def headers(response):
    return {h.key: h.value for h in response.response_headers_to_add}


# A calm tenant: OK, with its limit and the IETF policy header.
calm = ask(descriptor(("tenant", "calm"), ("path", "/api")))
assert calm.overall_code == RateLimitResponseCode.OK, calm
status = calm.statuses[0]
assert status.code == RateLimitResponseCode.OK
assert status.current_limit.requests_per_unit == 1000, status
assert status.current_limit.unit == RateLimitResponseRateLimitUnit.SECOND
assert headers(calm) == {"RateLimit-Policy": '"messages";q=1000;w=1'}, headers(calm)

# A descriptor without the tenant key is allowed (the default) and
# reported OK beside a mapped one.
mixed = ask(descriptor(("remote_address", "10.0.0.1")), descriptor(("tenant", "calm")))
assert [s.code for s in mixed.statuses] == [RateLimitResponseCode.OK] * 2, mixed

# A descriptor naming its publisher (the sidecar's `publisher_key` is
# `client` here): decided on the publisher's own lane, the same verdict.
named = ask(descriptor(("tenant", "calm"), ("client", "c-7")))
assert named.overall_code == RateLimitResponseCode.OK, named

# A heavy tenant: hits_addend of 100 per request, far over 1000/s.
over = None
for _ in range(400):
    response = ask(descriptor(("tenant", "heavy"), hits=100))
    if response.overall_code == RateLimitResponseCode.OVER_LIMIT:
        over = response
assert over is not None, "never over limit"
status = over.statuses[0]
assert status.code == RateLimitResponseCode.OVER_LIMIT
assert status.duration_until_reset is not None and status.duration_until_reset.total_seconds() > 0, status
h = headers(over)
assert h["RateLimit"].startswith('"messages";r=0;t=') and int(h["Retry-After"]) >= 1, h

# One descriptor over the limit makes the whole request OVER_LIMIT.
both = ask(descriptor(("tenant", "calm")), descriptor(("tenant", "heavy"), hits=100))
assert both.overall_code == RateLimitResponseCode.OVER_LIMIT or both.statuses[1].code == RateLimitResponseCode.OK

# Bad input: INVALID_ARGUMENT naming the field.
for request, says in [
    (RateLimitRequest(domain="edge", descriptors=[]), "descriptors is empty"),
    (RateLimitRequest(domain="edge", descriptors=[descriptor(("tenant", ""))]), "descriptors[0].entries[tenant] is empty"),
    (RateLimitRequest(domain="edge", descriptors=[descriptor(("tenant", "calm"), ("client", ""))]),
     "descriptors[0].entries[client] is empty"),
]:
    try:
        stub.should_rate_limit(request)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and says in e.details(), (e.code(), e.details())
    else:
        raise AssertionError(f"{request} was accepted")
print("envoy_rls: ok")
