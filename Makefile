# Thin wrappers over scripts/rlc.sh, which sets up .venv from nothing.
.PHONY: install train test lint bench docs

install:
	bash scripts/rlc.sh test --version

train:
	bash scripts/rlc.sh train

test:
	bash scripts/rlc.sh test

lint:
	bash scripts/rlc.sh lint

bench:
	bash scripts/rlc.sh bench

docs:
	bash scripts/rlc.sh docs
