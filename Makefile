# udskit — the two commands the README promises:
#   make demo   build, then run a short side-by-side benchmark on an embedded default
#   make test   install test dependencies if missing, then run every test
GO      ?= go
BIN     ?= bin/udskit
FUZZTIME ?= 5s

.PHONY: all build demo test deps vet gotest fuzz allocs bench clean portable doccheck python-test node-test

all: build

build:
	$(GO) build -trimpath -o $(BIN) ./cmd/udskit

demo: build
	./scripts/demo.sh $(BIN)

deps:
	./scripts/install-deps.sh

vet:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...

gotest:
	$(GO) test -race -count=1 -timeout 15m ./...

fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

# Every ```go block of README.md and docs/*.md, built (and run) as a user's
# program would be; part of gotest too. Failures name the file and line.
doccheck:
	$(GO) test -count=1 -run TestDocExamples ./internal/doccheck

# docs/kubernetes.md's manifests: decoded strictly against k8s.io/api's types, the recipe's
# rules checked, the sidecar and its probes run as the manifest's uids. Its own module
# (tools/k8scheck/go.mod) keeps k8s.io/api out of udskit's go.mod.
.PHONY: k8scheck
k8scheck: build
	cd tools/k8scheck && UDSKIT_BIN=$(abspath $(BIN)) $(GO) test -count=1 ./...

# udskit's shared-memory rows beside cloudwego/shmipc-go v0.2.0 (docs/performance.md, "Shared
# memory"). Its own module (tools/benchshm/go.mod) keeps shmipc-go out of udskit's go.mod.
.PHONY: benchshm benchshm-run
benchshm:
	cd tools/benchshm && $(GO) vet ./... && $(GO) test -count=1 ./...
benchshm-run:
	cd tools/benchshm && $(GO) run . -sizes 64,64k,1m -conc 1,16 -duration 2s -repeat 3

# Allocation counts need a build without -race (it makes sync.Pool drop items).
allocs:
	$(GO) test -count=1 -run 'Alloc' ./rpc ./bench

# udskit is for unix systems: macOS must build; a Windows build
# must stop at the one clear message (uds/unixonly.go; building uds alone shows
# it without compiling every dependency for Windows).
portable:
	GOOS=darwin $(GO) build ./...
	@out=$$(GOOS=windows $(GO) build ./uds 2>&1); \
	  if echo "$$out" | grep -q udskit_needs_a_unix_system; then echo "GOOS=windows: refused with the unix-only message, as intended"; \
	  else echo "GOOS=windows go build did not say udskit needs a unix system:"; echo "$$out"; exit 1; fi

test: deps vet portable gotest fuzz allocs node-test python-test k8scheck benchshm

# Python package (clients/python): a venv with the package and its pinned test extra, then
# pytest (vectors, interop with $(BIN), the Go server and client) and mypy --strict.
PYTHON  ?= python3
PYVENV  ?= clients/python/.venv
python-test: build
	@test -x $(PYVENV)/bin/python || $(PYTHON) -m venv $(PYVENV)
	$(PYVENV)/bin/python -m pip install -q --disable-pip-version-check -e './clients/python[test]'
	$(GO) build -o $(PYVENV)/grpcecho ./tools/grpcecho
	UDSKIT_BIN=$(abspath $(BIN)) UDSKIT_GRPC_ECHO=$(abspath $(PYVENV)/grpcecho) \
	  $(PYVENV)/bin/python -m pytest -q -p no:cacheprovider clients/python/tests
	cd clients/python && .venv/bin/python -m mypy --strict --cache-dir=.venv/.mypy_cache src tests tools ../../tools/soak/server_python.py

# clients/node: npm ci (pinned lockfile), tsc, then node:test incl. interop with $(BIN); then the
# install tests (npm pack/install from the repository, ESM, CommonJS, a strict TS project).
node-test: build
	cd clients/node && npm ci --no-audit --no-fund && npm run build && UDSKIT_BIN=$(abspath $(BIN)) npm test
	cd clients/node && UDSKIT_BIN=$(abspath $(BIN)) npm run test:install


bench: build
	./bench/run.sh

clean:
	rm -rf bin
