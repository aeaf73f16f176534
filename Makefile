# Everyday commands. The virtual environment is set up by `bash .ci/run` (or by hand:
# python3 -m venv .venv && .venv/bin/pip install -e '.[test]' -e ./sim); VENV=DIR chooses another.
#
#   make lint       ruff check, ruff format --check, mypy, lint-imports (import contracts)
#   make test-fast  the fast tests on SQLite only (no tests marked slow, no PostgreSQL)
#   make test       the whole suite on SQLite and PostgreSQL in WORKERS (2) processes, as .ci/run
#   make demo       the demo (ARGS=--once stops after the story)
#   make bench      every benchmark (ARGS=--short for the quick run, ARGS="--only claims")
#   make protos     regenerate the kubelet gRPC stubs (app/node/grpcapi) from their .proto files
#
# Extra pytest arguments go in ARGS too, e.g. make test-fast ARGS="tests/unit -x".

VENV ?= .venv
BIN := $(VENV)/bin
PYTEST := $(BIN)/pytest -q -p no:cacheprovider
WORKERS ?= 2
ARGS ?=

.PHONY: lint test-fast test demo bench protos

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test-fast:
	FABRIC_DRA_TEST_DATABASES=sqlite $(PYTEST) -m "not slow" $(ARGS)

test:
	$(PYTEST) -n $(WORKERS) $(ARGS)

demo:
	$(BIN)/fabric-dra demo $(ARGS)

bench:
	$(BIN)/python -m bench $(ARGS)

# Regenerate the kubelet gRPC stubs in app/node/grpcapi from its .proto files (needs the test
# extras: grpcio-tools). tests/unit/test_grpcapi_generated.py fails when they are stale.
protos:
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. app/node/grpcapi/*.proto
