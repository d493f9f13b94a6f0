# Every folder with a go.mod is a module; `make test` vets and tests each.
MODULES := $(shell find . -name go.mod -not -path './.git/*' -exec dirname {} \; | sort)
GO ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test demo bench bench-smoke lint examples

# Vet and race-test every module in the repository.
test:
	@set -e; for m in $(MODULES); do \
		echo "== $$m"; \
		(cd $$m && $(GO) vet ./... && $(GO) test -race -shuffle=on -count=1 ./...); \
	done
	@echo "== . (allocation counts, without -race)"
	$(GO) test -count=1 -run 'Allocat' .

# The seed lesson's burst against a real server on 127.0.0.1, as a timeline.
demo:
	cd _example && $(GO) run ./demo

# Build every example (./... skips folders that start with an underscore).
examples:
	cd _example && $(GO) build ./...

# The benchmark suite: rewrites BENCHMARKS.md and its chart (a few minutes).
bench:
	cd bench && $(GO) run ./cmd/report -out ..

# Every benchmark once, to keep the suite compiling and running (CI).
bench-smoke:
	cd bench && $(GO) run ./cmd/report -smoke

# gofmt and staticcheck over every module.
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	@set -e; for m in $(MODULES); do (cd $$m && $(STATICCHECK) ./...); done
