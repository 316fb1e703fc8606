# longhaul: thin targets over scripts/ (see README.md). `make help` prints
# the lines below, one per target (tests/test_makefile.py checks that every
# target is listed):
#   make help              this list
#   make setup             install everything a fresh Debian machine needs (idempotent)
#   make build             release binaries, completions, man pages and the live view into dist/
#   make test              everything CI runs (runs setup first): the stages below
#   make lint              rustfmt, clippy, yamllint, ansible-lint, promtool, dashboard and licence checks
#   make test-rust         cargo test of the workspace
#   make test-integration  tests/ on loopback with the built binaries (needs make build)
#   make test-roles        Molecule: every role's default scenario
#   make test-lab          the lab end to end (needs make build; LAB_ID picks a lab)
#   make bench             benchmarks: memory (vs iperf3 and a baseline engine), disk, exporter, live view,
#                          central store (VictoriaMetrics vs Prometheus)
#   make demo              the product end to end on this machine; make demo-down undoes it
#   make demo-down         remove the demo's lab (keeps results/)
#   make clean             remove cargo's target directory, dist/ and results/

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

LONGHAUL_CACHE ?= /var/cache/longhaul
VENV ?= $(LONGHAUL_CACHE)/venv
CARGO_TARGET_DIR ?= $(CURDIR)/target
export LONGHAUL_CACHE CARGO_TARGET_DIR
export PATH := $(VENV)/bin:$(PATH)
export LONGHAUL_DIST ?= $(CURDIR)/dist

STAGE := scripts/stage
BINARIES := longhaul longhaul-exporter longhaul-delay

.PHONY: help setup build lint test test-rust test-integration test-roles test-lab bench demo demo-down clean

help:
	@sed -n 's/^#   make /make /p' Makefile

setup:
	@$(STAGE) setup scripts/setup

# Binaries, and their shell completions and man pages (xtask), into dist/; the
# live view (web/, its npm packages from make setup) into dist/web/.
build:
	@$(STAGE) build bash -c 'cargo build --release --locked --workspace --bins && \
	  mkdir -p dist && for b in $(BINARIES); do install -m 0755 "$(CARGO_TARGET_DIR)/release/$$b" dist/; done && \
	  "$(CARGO_TARGET_DIR)/release/xtask" shell-files dist >/dev/null && \
	  node web/build.mjs dist/web'

lint:
	@$(STAGE) lint scripts/lint

# The lab, and Molecule followed by the integration tests, run side by side: each
# mostly waits (on containers, transfers of a set length, timeouts). The lab's
# throughput checks judge the path's share of what the machine gave them; the
# integration tests' time bounds passed beside the lab and a release build
# (issue 43's rehearsals), and a flake there is a bug to fix, not a reason to
# run them alone.
test: setup
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory test-rust
	@$(MAKE) --no-print-directory build
	@MAKE="$(MAKE)" $(STAGE) checks scripts/together test-roles,test-integration test-lab

# A test that cannot run here fails (longhaul-testkit), unless LONGHAUL_ALLOW_SKIP=1;
# check-test-skips refuses tests that print a skip of their own and pass.
test-rust:
	@$(STAGE) test-rust bash -c 'scripts/check-test-skips && cargo test --locked --workspace'

# Integration tests start real binaries on loopback; the lab has its own stage.
test-integration:
	@$(STAGE) test-integration scripts/pytest-run tests --ignore=tests/lab --durations=20

test-roles:
	@$(STAGE) test-roles scripts/molecule-all

# End-to-end: the lab (two pairs of transfer hosts), provisioned with site.yml.
test-lab:
	@$(STAGE) test-lab scripts/pytest-run tests/lab --durations=30

# bench-memory builds the baseline engine (BENCH_BASELINE, a git revision) once into
# $(LONGHAUL_CACHE)/bench-baseline/ and ends with issue 16's targets, PASS/FAIL each.
bench: build
	@for b in memory disk exporter live-view store; do $(STAGE) bench-$$b scripts/bench-$$b; done

demo: setup build
	@$(STAGE) demo scripts/demo

demo-down:
	@$(STAGE) demo-down scripts/demo-down

clean:
	cargo clean
	rm -rf dist results
