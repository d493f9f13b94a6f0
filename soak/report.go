package main

import "runtime"

func runtimeCPU() int   { return runtime.NumCPU() }
func goVersion() string { return runtime.Version() }

const reportHead = `# Reliability

<!-- Written by ` + "`make soak`" + ` (soak/). The figures below are the last run's. -->

A throttle sits in front of everything, so it must hold when everything else
is failing. This is what is tested, how to run it, and what the last run saw.

## What is tested

| what | where | runs in |
|---|---|---|
| Load, faults and a Close in the middle, over real HTTP on 127.0.0.1, in-memory and Redis backends in turn, priorities and flows on: keep-alive and short-lived connections, random handler times (0–20 ms), client hang-ups (5%), client timeouts (3%), panicking handlers (2%), the Queue shut down and replaced twice while requests are in flight. Checks: every request has exactly one outcome (the response its client read, or its client's own hang-up) and the server's OnOutcome agrees with the client; running never exceeds the limit; the counters equal the outcomes; goroutines and heap come back to where they started, within the margins shown. | ` + "`soak/`" + ` | ` + "`make soak`" + ` (140 s of load, under 3 minutes in all); CI runs 10 seconds of it |
| A schedule fuzzer: bytes become arrivals with priorities and flows, hang-ups, releases, time passing, limit changes and a Close, played against the in-memory Backend in fake time; after every step: at most one outcome per arrival and exactly one at the end, Stats equal to the holders and waiters, the queue and every flow within their bounds, nobody waiting while a slot is free, FIFO within a priority and flow, a timeout exactly QueueTimeout after arrival. | ` + "`FuzzSchedule`" + ` in fuzz_internal_test.go | seed corpus in ` + "`make test`" + `; CI fuzzes it for 80,000 runs (about 15 s) |
| The config validator: any Config either builds a working Queue or is refused with an error that names a Config field; nothing panics. | ` + "`FuzzConfigValidate`" + ` | seed corpus in ` + "`make test`" + `; CI fuzzes it for 50,000 runs (a few seconds) |
| CoDel: any Target, Interval and QueueTimeout (negative, 1 ns, equal, centuries, QueueTimeout below Target) is refused by Validate and Start alike with an error naming a Limits field, or plays a schedule of arrivals, hang-ups, releases and time passing in fake time, with and without LIFO: one outcome per arrival, Stats equal to the holders and waiters, nobody waiting while a slot is free, every timeout between the short and the long maximum wait, every grant before the long one, FIFO within a priority and flow without LIFO. | ` + "`FuzzCoDel`" + ` in fuzz_internal_test.go | seed corpus in ` + "`make test`" + `; CI fuzzes it for 50,000 runs (about 15 s) |
| The adaptive limiter: any sequence of handler times (zero, under a microsecond, hours, negative, alternating fast and slow), for both algorithms and a range of settings, keeps the limit finite and within [MinLimit, MaxLimit], and steady normal load then brings it back up by a bound derived in the test. | ` + "`FuzzAdaptive`" + ` in fuzz_internal_test.go | seed corpus in ` + "`make test`" + `; CI fuzzes it for 20,000 runs |
| Randomized schedules through the middleware (arrivals, hang-ups, timeouts, panics, closes, limit changes, priorities, flows): running <= limit, queue <= MaxQueue, FIFO per class, one outcome per request, counters add up; at every look during the run, counters and histogram buckets never go down, Served >= Running, the split by priority adds up to Queued, the drain rate is finite. | ` + "`TestRandomSchedules`" + ` | ` + "`make test`" + ` |
| Every order of the lock-free steps: the fast path, Release, a waiter parking and SetLimit (raising and lowering), weighted requests, and Stats reading the queue while a section under the lock publishes it, enumerated one atomic step at a time in small scenarios; after each step no admission past the limit, at the end no waiter parked beside a free slot, and every Stats a view the queue was in. | ` + "`TestInterleavings`" + `, ` + "`TestInterleavingsOfStats`" + ` in interleave_internal_test.go | ` + "`make test`" + ` |
| Bad input: flow keys of 1 MiB and invalid UTF-8, priorities at MinInt and MaxInt, a million rotating flow keys: a clear outcome, no panic, memory bounded by the waiters. | ` + "`TestExtremeInputs`" + `, ` + "`TestRotatingKeysDoNotGrowMemory`" + ` | ` + "`make test`" + ` |
| Redis faults: a replica killed holding slots, ` + "`CLIENT PAUSE`" + ` with both policies, a restart and a flush of Redis mid-run, three OS processes on one limit; on a 6-node Cluster and a Sentinel set of their own, under load, ` + "`CLUSTER FAILOVER`" + `, ` + "`SENTINEL FAILOVER`" + `, kill -9 of the master, two manual failovers in a row, with LeaseTTL 3 s, 15 s and 1 min, and writes lost to asynchronous replication, each checked for service back within 2 s of the new master, no wait past QueueTimeout + CallTimeout, 503 not 408 under FailClosed, nothing leaked. | redisqueue/*_test.go (` + "`TestTopologyCluster`" + `, ` + "`TestTopologySentinel`" + `) | ` + "`make test`" + ` (about 4 minutes of it, when redis-server is installed); ` + "`make soak-redis`" + ` runs the Redis soak alone for 140 s |

## How to run it

    make soak                                   # 140 s of load, rewrites this file
    cd soak && go run . -duration 20s           # a shorter run, prints only
    go test -run '^$' -fuzz FuzzSchedule -fuzztime 5m .

The soak needs a Redis at REDIS_ADDR (default 127.0.0.1:6379; start one with
` + "`redis-server --port 6379 --save ''`" + `).

`
