"""Drives traffic through several damper-agentd sidecars with redis-py, as
nodes in other languages would: each ACCOUNT:RATE:COST item (cost per
second, cost per operation) is spread evenly over the sidecars and sent in
pipelined batches every 10 ms. Prints one JSON line per item per second:
what was attempted and admitted, in cost, as the sidecars answered.
Usage: flood.py SECONDS HOST:PORT[,HOST:PORT...] ACCOUNT:RATE:COST...
"""
import json
import sys
import time

import redis

seconds = float(sys.argv[1])
clients = [redis.Redis(host=a.rsplit(":", 1)[0], port=int(a.rsplit(":", 1)[1])) for a in sys.argv[2].split(",")]
items = []
for spec in sys.argv[3:]:
    account, rate, cost = spec.split(":")
    items.append({"account": account, "ops_per_sec": float(rate) / int(cost), "cost": int(cost), "sent": 0})

start = time.monotonic()
per_second = {}  # (second, account) -> [attempted, admitted]
tick = 0
while True:
    tick += 1
    due = start + tick * 0.01
    now = time.monotonic()
    if now < due:
        time.sleep(due - now)
    elapsed = min(time.monotonic() - start, seconds)
    second = int(elapsed) + 1
    pipes = [c.pipeline(transaction=False) for c in clients]
    sent = []
    for item in items:
        # Operations due by now, minus those sent: catches up after a stall.
        n = int(elapsed * item["ops_per_sec"]) - item["sent"]
        item["sent"] += n
        for i in range(n):
            pipes[(item["sent"] + i) % len(pipes)].execute_command(
                "DAMPER.CHECK", item["account"], "messages", item["cost"])
            sent.append((item, (item["sent"] + i) % len(pipes)))
    answers = [iter(p.execute()) for p in pipes]
    for item, which in sent:
        admitted = next(answers[which])[0]
        row = per_second.setdefault((min(second, int(seconds)), item["account"]), [0, 0])
        row[0] += item["cost"]
        row[1] += item["cost"] * admitted
    if elapsed >= seconds:
        break

for (second, account), (attempted, admitted) in sorted(per_second.items()):
    print(json.dumps({"t": second, "account": account, "attempted": attempted, "admitted": admitted}))
