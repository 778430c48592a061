"""redis-py against a running damper-agentd: RESP2 and RESP3, TCP and a
Unix socket, pipelined and not, errors that keep the connection, and a
flood refused with its factor and retry hint. Exits non-zero with the
failed assertion's message. Usage: resp_clients.py HOST:PORT UNIX_PATH
"""
import sys

import redis

host, port = sys.argv[1].rsplit(":", 1)
unix_path = sys.argv[2]


def check(client, account, op="messages", cost=None):
    args = ["DAMPER.CHECK", account, op] + ([] if cost is None else [cost])
    return client.execute_command(*args)


# RESP2: bulk strings for the factor and the limit, as Redis does for scores.
r2 = redis.Redis(host=host, port=int(port), decode_responses=True, client_name="resp2-client")
assert r2.ping() is True
admitted, factor, retry_ms, limit = check(r2, "calm", cost=5)
assert (admitted, float(factor), retry_ms, float(limit)) == (1, 0.0, 0, 1000.0), (admitted, factor, retry_ms, limit)
assert r2.client_getname() == "resp2-client"

# RESP3 (redis-py sends HELLO 3 on connecting): doubles are doubles.
r3 = redis.Redis(host=host, port=int(port), protocol=3)
reply = check(r3, "calm")
assert reply == [1, 0.0, 0, 1000.0], reply
hello = r3.execute_command("HELLO", "3")
assert hello[b"server"] == b"damper-agentd" and hello[b"proto"] == 3, hello

# Pipelined: 500 checks in one round trip, answered in order.
pipe = r2.pipeline(transaction=False)
for i in range(500):
    pipe.execute_command("DAMPER.CHECK", f"pipelined-{i % 5}", "messages", 1)
replies = pipe.execute()
assert len(replies) == 500 and all(r[0] == 1 for r in replies), replies[:3]

# A publisher named with FROM: decided on its own lane.
assert r2.execute_command("DAMPER.CHECK", "calm", "messages", 2, "FROM", "conn-7")[0] == 1

# Bad input: a precise error, the connection kept, nothing counted.
for args, says in [
    (["DAMPER.CHECK", "calm", "messages", 1, "FROM"], "wrong number of arguments"),
    (["DAMPER.CHECK", "calm", "messages", 1, "BY", "conn-7"], "syntax error: expected FROM publisher"),
    (["DAMPER.CHECK", "calm", "messages", 1, "FROM", ""], "publisher is empty"),
    (["DAMPER.CHECK", "calm"], "wrong number of arguments for 'damper.check' command"),
    (["DAMPER.CHECK", "calm", "messages", -1], "cost: not a non-negative integer"),
    (["DAMPER.CHECK", "calm", "messages", "1.5"], "cost: not a non-negative integer"),
    (["DAMPER.CHECK", "", "messages"], "account is empty"),
    (["DAMPER.CHECK", "a" * 300, "messages"], "account is 300 bytes long; the limit is 256"),
    (["NOSUCH", "x"], "unknown command 'NOSUCH'"),
]:
    try:
        r2.execute_command(*args)
    except redis.ResponseError as e:
        assert says in str(e), (args, str(e))
    else:
        raise AssertionError(f"{args} was accepted")
    assert r2.ping() is True

# Errors inside a pipeline come back in place, the rest answered.
pipe = r2.pipeline(transaction=False)
pipe.execute_command("DAMPER.CHECK", "calm", "messages")
pipe.execute_command("DAMPER.CHECK", "calm", "messages", "lots")
pipe.execute_command("DAMPER.PEEK", "calm", "messages")
out = pipe.execute(raise_on_error=False)
assert out[0][0] == 1 and isinstance(out[1], redis.ResponseError) and float(out[2][1]) == 1000.0, out

# INFO parses as Redis's does.
info = r2.info()
assert info["damper_agentd_version"] and "rollups_sent" in info, info

# A Unix-socket client.
ru = redis.Redis(unix_socket_path=unix_path, decode_responses=True)
assert ru.ping() is True
assert check(ru, "calm")[0] == 1

# A single-node flood: the local guard refuses most of it, and a refusal
# says why and when to retry.
pipe = r2.pipeline(transaction=False)
for _ in range(20_000):
    pipe.execute_command("DAMPER.CHECK", "flood", "messages", 1)
replies = pipe.execute()
refused = [r for r in replies if r[0] == 0]
assert len(refused) > 10_000, len(refused)
_, factor, retry_ms, limit = refused[-1]
# The limit the refusal names: the account's 1000 once its master has
# answered for the pair, or, until then, the room the local guard allows
# a new pair over the op's default (twice it): which one depends on how
# fast the master's answer came back beside the pipeline.
assert float(factor) > 0.5 and retry_ms > 0 and float(limit) in (1000.0, 2000.0), refused[-1]
factor, limit, reason = r2.execute_command("DAMPER.PEEK", "flood", "messages")
assert float(factor) > 0.5 and reason in ("local_guard", "account_limit"), (factor, reason)
print(f"resp_clients: ok ({len(refused)} of 20000 flood checks refused)")
