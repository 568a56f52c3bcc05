# The test command the README gives and .ci/run calls. Tests start their own
# PostgreSQL (from the installed binaries) and nats-server (embedded).
GO ?= go
PKGS := ./...

.PHONY: test lint oldest-go unit cluster deploy bench-smoke demo stress screenshots

test: lint unit cluster deploy bench-smoke

# The tests on a three-node cluster (leader kills, partitions) run on their
# own, one package at a time, after the rest: three servers under -race
# beside the other packages' tests starve each other on a 2-core machine;
# the power-loss run's servers and consumers are processes of their own.
CLUSTER := Cluster|LeaderElections|PowerLoss
# Only the packages that hold such a test: linking and starting the other
# packages' race-built test binaries to run nothing cost a minute and a half.
# deploy is a module of its own and has a phase of its own.
CLUSTER_PKGS := $(shell grep -rlE '^func (Test|Example)[A-Za-z0-9_]*($(CLUSTER))' --include='*_test.go' --exclude-dir=deploy --exclude-dir=.git . | xargs -rn1 dirname | sort -u)

lint: oldest-go
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# go.mod's go directive is the older of the two supported Go releases (Go
# supports the newest two), so an embedder is not forced onto the newest
# Go. The library packages must build with that release: they are vetted
# with it whenever the machine's Go is of that release (no other toolchain
# is fetched).
OLDEST_GO := 1.26
LIB_PKGS := ./inbox/... ./inboxtest/... ./outbox/... ./delivery/... ./jitter/... ./metrics/... ./effects/...
oldest-go:
	@dir=$$($(GO) list -m -f '{{.GoVersion}}'); case "$$dir" in $(OLDEST_GO)|$(OLDEST_GO).*) ;; \
	  *) echo "go.mod says go $$dir, want the older supported release $(OLDEST_GO)"; exit 1;; esac
	@if GOTOOLCHAIN=local $(GO) version | grep -q 'go$(OLDEST_GO)[. ]'; then \
	  GOTOOLCHAIN=local $(GO) vet $(LIB_PKGS); \
	else echo "oldest-go: this machine's Go is not $(OLDEST_GO); library not vetted with it"; fi

unit:
	$(GO) test -race -count=1 -timeout 12m -skip '$(CLUSTER)' $(PKGS)

# The chaos package's cluster and power-loss runs (five minutes, mostly
# waiting on elections, restarts and fsyncs) go beside the other packages'
# cluster tests, which still run one package at a time.
CLUSTER_BESIDE := ./internal/chaos
cluster:
ifeq ($(PKGS),./...)
	@$(GO) test -race -count=1 -timeout 12m -p 1 -run '$(CLUSTER)' $(CLUSTER_BESIDE) & beside=$$!; \
	  $(GO) test -race -count=1 -timeout 12m -p 1 -run '$(CLUSTER)' $(filter-out $(CLUSTER_BESIDE),$(CLUSTER_PKGS)); rest=$$?; \
	  wait $$beside; b=$$?; [ $$rest -eq 0 ] && [ $$b -eq 0 ]
else
	$(GO) test -race -count=1 -timeout 12m -p 1 -run '$(CLUSTER)' $(PKGS)
endif

# deploy/ is its own module (its validators pull in Prometheus, Kubernetes
# and compose-go); every shipped config file is parsed and checked there.
# Its stack tests spend most of their time waiting on the servers and
# binaries they start: three run at once.
deploy:
	cd deploy && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 10m -parallel 3 ./...

# Every Go benchmark once, so they keep compiling and running; only the
# packages that have one are linked.
BENCH_PKGS := $(shell grep -rlE '^func Benchmark' --include='*_test.go' --exclude-dir=deploy --exclude-dir=.git . | xargs -rn1 dirname | sort -u)
bench-smoke:
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x $(if $(filter ./...,$(PKGS)),$(BENCH_PKGS),$(PKGS))

demo:
	$(GO) run ./cmd/jetinbox demo

# The console's pictures in docs/console/, taken by headless Chromium on a
# demo run (not by hand).
screenshots:
	$(GO) run ./cmd/jetinbox demo -intents 2000 -http=false -console -screenshots docs/console

# The unit and cluster phases twice beside a CPU hog on one of the cores,
# listing every test that failed in any run (ROUNDS=, HOGS= change it).
stress:
	./.ci/stress
