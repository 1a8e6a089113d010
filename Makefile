# udskit — the two commands the README promises:
#   make demo   build, then run a short side-by-side benchmark on an embedded default
#   make test   install test dependencies if missing, then run every test
GO      ?= go
BIN     ?= bin/udskit
FUZZTIME ?= 5s

.PHONY: all build demo test deps vet gotest fuzz bench clean python-test

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

test: deps vet gotest fuzz python-test

# Python package (clients/python): a venv with the package and its pinned test extra, then
# pytest (vectors, interop with the Go server and client) and mypy --strict.
PYTHON  ?= python3
PYVENV  ?= clients/python/.venv
python-test:
	@test -x $(PYVENV)/bin/python || $(PYTHON) -m venv $(PYVENV)
	$(PYVENV)/bin/python -m pip install -q --disable-pip-version-check -e './clients/python[test]'
	$(GO) build -o $(PYVENV)/udskit ./cmd/udskit
	UDSKIT_BIN=$(abspath $(PYVENV)/udskit) $(PYVENV)/bin/python -m pytest -q -p no:cacheprovider clients/python/tests
	cd clients/python && .venv/bin/python -m mypy --strict --cache-dir=.venv/.mypy_cache src tests

bench: build
	./bench/run.sh

clean:
	rm -rf bin
