# udskit — the two commands the README promises:
#   make demo   build, then run a short side-by-side benchmark on an embedded default
#   make test   install test dependencies if missing, then run every test
GO      ?= go
BIN     ?= bin/udskit
FUZZTIME ?= 5s

.PHONY: all build demo test deps vet gotest fuzz allocs bench clean

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

# Allocation counts need a build without -race (it makes sync.Pool drop items).
allocs:
	$(GO) test -count=1 -run 'Alloc' ./rpc ./bench

test: deps vet gotest fuzz allocs

bench: build
	./bench/run.sh

clean:
	rm -rf bin
