"""Python grpcio against damper-agentd's damper.v1.Check, with stubs that
grpcio-tools generates here from proto/damper/v1/check.proto (not this
project's Rust code). Usage: grpc_check.py HOST:PORT PROTO_ROOT
"""
import atexit
import os
import shutil
import sys
import tempfile

import grpc
from grpc_tools import protoc

address, proto_root = sys.argv[1], sys.argv[2]
out = tempfile.mkdtemp(prefix="damper-check-stubs-")
atexit.register(shutil.rmtree, out, ignore_errors=True)
assert protoc.main(["protoc", f"-I{proto_root}", f"--python_out={out}", f"--grpc_python_out={out}",
                    os.path.join(proto_root, "damper/v1/check.proto")]) == 0
sys.path.insert(0, out)
from damper.v1 import check_pb2 as pb, check_pb2_grpc as rpc  # noqa: E402

stub = rpc.CheckStub(grpc.insecure_channel(address))

# Unset cost counts 1; the limit is known from the sidecar's hello.
reply = stub.Check(pb.CheckRequest(account="calm", op="messages"), timeout=5)
assert reply.admitted and reply.factor == 0.0 and reply.limit == 1000.0, reply
assert reply.reason == pb.REASON_UNSPECIFIED

# A batch, answered in order.
many = stub.CheckMany(pb.CheckManyRequest(checks=[
    pb.CheckRequest(account="calm", op="messages", cost=3),
    pb.CheckRequest(account="other", op="messages", cost=0),
    pb.CheckRequest(account="calm", op="unlimited-op"),
]), timeout=5)
assert [r.admitted for r in many.replies] == [True, True, True], many
assert many.replies[2].limit == 0.0, many.replies[2]

# Publishers named: decided on their own lanes, the same verdicts here.
named = stub.Check(pb.CheckRequest(account="calm", op="messages", cost=2, publisher="conn-7"), timeout=5)
assert named.admitted and named.limit == 1000.0, named

# Bad input: INVALID_ARGUMENT naming the field.
for call, request, says in [
    (stub.Check, pb.CheckRequest(account="", op="messages"), "account is empty"),
    (stub.Check, pb.CheckRequest(account="calm", op="x" * 257), "op is 257 bytes long"),
    (stub.CheckMany, pb.CheckManyRequest(checks=[pb.CheckRequest(account="a", op="m"),
                                                  pb.CheckRequest(account="", op="m")]),
     "checks[1].account is empty"),
    (stub.Peek, pb.PeekRequest(account="calm", op=""), "op is empty"),
    (stub.Check, pb.CheckRequest(account="calm", op="messages", publisher=""), "publisher is empty"),
    (stub.CheckMany, pb.CheckManyRequest(checks=[pb.CheckRequest(account="a", op="m", publisher="p" * 300)]),
     "checks[0].publisher is 300 bytes long"),
]:
    try:
        call(request, timeout=5)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and says in e.details(), (e.code(), e.details())
    else:
        raise AssertionError(f"{request} was accepted")

# A flood through CheckMany is refused with the reason and a retry hint.
batch = pb.CheckManyRequest(checks=[pb.CheckRequest(account="grpc-flood", op="messages")] * 5000)
refused = [r for _ in range(4) for r in stub.CheckMany(batch, timeout=5).replies if not r.admitted]
assert len(refused) > 10_000, len(refused)
assert refused[-1].retry_after_ms > 0 and refused[-1].reason in (pb.REASON_ACCOUNT_LIMIT, pb.REASON_LOCAL_GUARD)
# It says how far over: the demand the factor came from, above the limit.
assert refused[-1].demand > refused[-1].limit > 0, refused[-1]
# And as a share of the limit: over 1.
assert refused[-1].utilisation > 1.0, refused[-1]
# The same flood on an op whose limit is in shadow: nothing refused, the
# would-be refusals marked, with their reason.
trial = pb.CheckManyRequest(checks=[pb.CheckRequest(account="grpc-flood", op="trial")] * 5000)
replies = [r for _ in range(4) for r in stub.CheckMany(trial, timeout=5).replies]
assert all(r.admitted for r in replies), [r for r in replies if not r.admitted][:1]
marked = [r for r in replies if r.would_reject]
assert len(marked) > 10_000, len(marked)
assert marked[-1].reason in (pb.REASON_ACCOUNT_LIMIT, pb.REASON_LOCAL_GUARD), marked[-1]
peek = stub.Peek(pb.PeekRequest(account="grpc-flood", op="messages"), timeout=5)
assert peek.tracked and peek.factor > 0.5 and peek.limit == 1000.0, peek
untracked = stub.Peek(pb.PeekRequest(account="never-seen", op="messages"), timeout=5)
assert not untracked.tracked and untracked.factor == 0.0 and untracked.limit == 1000.0, untracked
print(f"grpc_check: ok ({len(refused)} of 20000 flood checks refused)")

# gRPC health checking and reflection, as probes and grpcurl use them
# (raw protobuf bytes, so no further stubs are needed).
channel = grpc.insecure_channel(address)
health = channel.unary_unary("/grpc.health.v1.Health/Check")
service = b"damper.v1.Check"
assert health(b"\n" + bytes([len(service)]) + service, timeout=5) == b"\x08\x01", "SERVING"
reflection = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
listed = b"".join(reflection(iter([b"\x3a\x00"]), timeout=5))
assert b"damper.v1.Check" in listed and b"grpc.health.v1.Health" in listed, listed
print("grpc_check: health SERVING, reflection lists damper.v1.Check")
