# Every folder with a go.mod is a module; `make test` vets and tests each.
# go.work at the root puts all of them in one workspace, so each sees the
# others as they are in this tree (see RELEASING.md).
MODULES := $(shell find . -name go.mod -not -path './.git/*' -exec dirname {} \; | sort)
GO ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test test-long demo bench bench-smoke bench-goodput bench-weighted bench-fleet bench-fleet-scale lint examples soak soak-redis soak-smoke fuzz-smoke adaptive-chart tidy check-modules check-outside

# Vet and race-test every module in the repository, without the long
# suites (-short): a few minutes.
test:
	@set -e; for m in $(MODULES); do \
		echo "== $$m"; \
		(cd $$m && $(GO) vet ./... && $(GO) test -race -shuffle=on -count=1 -short ./...); \
	done
	@echo "== . and otelqueue (allocation counts, without -race)"
	$(GO) test -count=1 -run 'Allocat' . ./otelqueue

# The long suites that make test skips: redisqueue on a Cluster and a
# Sentinel set of its own (failovers, frozen masters, a replica killed with
# waiters) and fleets of OS processes through a Redis pause, a replica
# frozen past its lease, one started during a pause and weighted requests,
# in both modes; and fleets of one Name at scale (the case of hundreds of
# replicas runs only without the race detector, in the plain go test that
# follows). About 20 minutes.
test-long:
	cd redisqueue && $(GO) test -race -count=1 -timeout 45m -run 'Topology|FrozenMaster|ShutdownDuringKill|IdleKillThenBurst|FleetPaused|FleetLimit|FleetScale' .
	cd redisqueue && $(GO) test -count=1 -timeout 10m -run 'FleetScale' .

# A burst of 15 requests on 3 slots against a real server on 127.0.0.1, as a timeline.
demo:
	cd _example && $(GO) run ./demo

# Build every example (./... skips folders that start with an underscore).
examples:
	cd _example && $(GO) build ./...

# The benchmark suite: rewrites the tables of BENCHMARKS.md and its charts (a few minutes).
bench:
	cd bench && $(GO) run ./cmd/report -out ..

# Every benchmark once, to keep the suite compiling and running (CI).
bench-smoke:
	cd bench && $(GO) run ./cmd/report -smoke

# Section 12 of the suite alone, goodput under overload (about 2 minutes);
# prints its targets and table, writes nothing.
bench-goodput:
	cd bench && $(GO) run ./cmd/report -goodput

# Section 13 of the suite alone, weighted requests under Config.Cost (a few
# seconds); prints its targets and table, writes nothing.
bench-weighted:
	cd bench && $(GO) run ./cmd/report -weighted

# Section 14 of the suite alone: one limit for 4 replicas, shared as a static
# split, by redisqueue's GlobalQueue and by its Shares (under a minute; needs
# the Redis of make test); prints its table and targets, writes nothing.
bench-fleet:
	cd bench && $(GO) run ./cmd/report -fleet

# Section 15 alone, which make bench leaves out (and keeps as it is): one
# Name for 16 to 1,024 replicas in redisqueue's Shares mode, idle, loaded
# and as the load moves, on a redis-server that it starts on a free port
# and stops (about two minutes; needs redis-server on the PATH); prints its
# tables and targets and writes them into section 15 of BENCHMARKS.md.
bench-fleet-scale:
	cd bench && $(GO) run ./cmd/report -fleet-scale -out ..

# gofmt and staticcheck over every module.
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	@set -e; for m in $(MODULES); do (cd $$m && $(STATICCHECK) ./...); done

# Load, faults and a Close in the middle over loopback, in-memory then Redis
# backend; checks nothing is lost or leaked and rewrites RELIABILITY.md.
soak:
	cd soak && $(GO) run . -duration 140s -out ../RELIABILITY.md

# The Redis backend alone for 140 s (a slot kept after Shutdown showed only
# in runs this long); writes nothing.
soak-redis:
	cd soak && $(GO) run . -backend redis -duration 140s

# Ten seconds of the same, for CI; writes nothing.
soak-smoke:
	cd soak && $(GO) run . -duration 10s

# Each fuzz target for a short while (CI).
# Budgets are counts of executions, about 10-20 s each here: with a time
# budget, Go 1.26's fuzz coordinator can fail a clean run at the deadline
# ("context deadline exceeded", no failing input), fixed in Go 1.27.
fuzz-smoke:
	$(GO) test -run '^$$' -fuzz '^FuzzSchedule$$' -fuzztime 80000x .
	$(GO) test -run '^$$' -fuzz '^FuzzConfigValidate$$' -fuzztime 50000x .
	$(GO) test -run '^$$' -fuzz '^FuzzAdaptive$$' -fuzztime 20000x .
	$(GO) test -run '^$$' -fuzz '^FuzzCoDel$$' -fuzztime 50000x .

# Runs the adaptive-limit simulation and draws docs/adaptive.svg from it.
adaptive-chart:
	csv=$$(mktemp) && ADAPTIVE_CSV=$$csv $(GO) test -run TestAdaptiveLimitFollowsCapacity -count=1 . && (cd bench && $(GO) run ./cmd/adaptivechart -csv $$csv -out ../docs/adaptive.svg); rc=$$?; rm -f $$csv; exit $$rc

# go mod tidy in every module. Plain `go mod tidy` ignores go.work and fails
# in a sub-module while the ginqueue version it requires is unreleased; there
# this tidies against the folders of the other modules (see RELEASING.md).
tidy:
	.ci/tidy

# No replace in a library's go.mod, no zero pseudo-version, go.work complete.
check-modules:
	.ci/check-modules

# A module outside the repository, set up by the README's own install lines,
# builds against ginqueue, promqueue and redisqueue; the README's Quick start
# is _example/quickstart and builds the same way.
check-outside:
	.ci/outside-module
