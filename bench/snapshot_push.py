#!/usr/bin/env python3
"""Times a 10,000-route configuration from its commit to a data plane serving it.

Usage: snapshot_push.py SEED CONTROL_PLANE_ADDR OPS_URL DATA_PLANE_URL [ROUTES]

Reads the running stack's seed (SEED, the ApplyConfig JSON the control plane
started with), adds ROUTES routes (default 10,000) over 100 upstreams of 3
instances each (every instance is the seed's first upstream instance, so the
routes really answer), and commits the whole configuration with
`grpcurl ... gateway.v1.AdminService/ApplyConfig` while polling the data
plane's `OPS_URL/config` every millisecond or so until it reports the new
version. Then it asks a route of the new table for an answer (200 expected).

Prints one line: `MS_AFTER_COMMIT CALL_MS JSON_BYTES ROUTES`, where
MS_AFTER_COMMIT is the time from the version's `createdAt` (stamped by the
control plane as it commits, before the database write and its fsync) to the
first poll that saw the version applied: the write, the push over the config
stream, decoding, compiling and swapping the snapshot on the replica.
CALL_MS is the whole grpcurl call as this script saw it, grpcurl's own start
included. Exits non-zero with the reason on any failure.
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

UPSTREAMS = 100


def fail(msg):
    print(f"snapshot_push: {msg}", file=sys.stderr)
    sys.exit(1)


def get(url, host=None, timeout=2.0):
    req = urllib.request.Request(url)
    if host:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def served_version(ops):
    status, body = get(ops + "/config")
    if status != 200:
        fail(f"{ops}/config answered {status}")
    return json.loads(body)["version"]


def grpcurl_args(addr, method):
    """grpcurl reading the request's JSON from its standard input."""
    token = os.environ.get("BENCH_ADMIN_TOKEN", "")
    auth = ["-H", f"authorization: Bearer {token}"] if token else []
    return ["grpcurl", "-plaintext", *auth, "-d", "@", addr, f"gateway.v1.AdminService/{method}"]


def grpcurl(addr, method, request):
    """Calls `method` with `request` (JSON text); returns its JSON answer."""
    out = subprocess.run(
        grpcurl_args(addr, method), input=request, capture_output=True, text=True, timeout=120
    )
    if out.returncode != 0:
        fail(f"grpcurl {method} failed: {out.stderr.strip() or out.stdout.strip()}")
    return json.loads(out.stdout)


def committed_version(call, before):
    """Waits for the ApplyConfig call to end; the version it committed."""
    out, err = call.communicate(timeout=120)
    if call.returncode != 0:
        fail(f"grpcurl ApplyConfig failed: {err.strip() or out.strip()}")
    version = json.loads(out)["version"]
    if str(version) == str(before):
        fail(f"nothing was committed: version {before} already holds this configuration")
    return version


def config(seed, routes):
    cfg = json.load(open(seed))
    target = cfg["upstreams"][0]["instances"][0]["url"]
    for u in range(UPSTREAMS):
        cfg["upstreams"].append(
            {
                "name": f"service-{u:03}",
                "instances": [{"id": f"service-{u:03}-{i}", "url": target} for i in range(3)],
                "circuitBreaker": {
                    "failureThreshold": 5,
                    "resetTimeoutMs": 10000,
                    "halfOpenMaxRequests": 1,
                },
            }
        )
    for r in range(routes):
        u = r % UPSTREAMS
        route = {
            "name": f"route-{r:05}",
            "hosts": [f"api{r % 10}.example.com"],
            "pathPrefix": f"/api/service-{u:03}/resource-{r:05}",
            "methods": ["GET", "POST"],
            "upstream": f"service-{u:03}",
            "rewritePrefix": f"/resource-{r:05}",
            "auth": "AUTH_JWT" if r % 2 == 0 else "AUTH_NONE",
        }
        if r % 3 == 0:
            route["rateLimit"] = {
                "policy": f"policy-{u:03}",
                "algorithm": "TOKEN_BUCKET",
                "key": "KEY_IP",
                "limit": 100,
                "windowSeconds": 60,
            }
        cfg["routes"].append(route)
    return cfg


def main():
    if len(sys.argv) not in (5, 6):
        fail(__doc__.strip().splitlines()[2])
    seed, addr, ops, dp = sys.argv[1:5]
    routes = int(sys.argv[5]) if len(sys.argv) == 6 else 10_000
    if routes < 1:
        fail("ROUTES must be at least 1")
    before = served_version(ops)
    body = json.dumps(config(seed, routes)).encode()
    with tempfile.TemporaryFile() as payload:
        payload.write(body)
        payload.seek(0)
        started = time.monotonic()
        call = subprocess.Popen(
            grpcurl_args(addr, "ApplyConfig"),
            stdin=payload,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        applied_at = None
        # Known as soon as grpcurl ends: a failed or empty commit stops the wait at once.
        version = None
        deadline = started + 120
        while time.monotonic() < deadline:
            if served_version(ops) != before:
                applied_at = datetime.datetime.now(datetime.timezone.utc)
                break
            if version is None and call.poll() is not None:
                version = committed_version(call, before)
            time.sleep(0.001)
        if version is None:
            version = committed_version(call, before)
        call_ms = (time.monotonic() - started) * 1000
    if applied_at is None:
        fail(f"the data plane still served version {before} 120 s after the ApplyConfig call")
    now = served_version(ops)
    if str(now) != str(version):
        fail(f"the data plane serves version {now}, the commit made {version}")
    versions = grpcurl(addr, "ListConfigVersions", json.dumps({"limit": 1}))["versions"]
    meta = next((v for v in versions if str(v["version"]) == str(version)), None)
    if meta is None:
        fail(f"ListConfigVersions does not list version {version}: {versions}")
    committed = datetime.datetime.fromisoformat(meta["createdAt"].replace("Z", "+00:00"))
    after_commit_ms = (applied_at - committed).total_seconds() * 1000
    # The last route of the new table answers through the gateway (AUTH_NONE: odd index).
    last = routes - 1 if (routes - 1) % 2 == 1 else routes - 2
    if last >= 0:
        u = last % UPSTREAMS
        status, answer = get(
            f"{dp}/api/service-{u:03}/resource-{last:05}", host=f"api{last % 10}.example.com"
        )
        if status != 200:
            fail(f"route-{last:05} of the new table answered {status}: {answer[:200]!r}")
    print(f"{after_commit_ms:.0f} {call_ms:.0f} {len(body)} {routes}")


if __name__ == "__main__":
    main()
