# medstack: `make setup`, `make test`, `make demo`. See README.md.
.PHONY: setup test test-fast demo clean-venv

setup:
	bash scripts/setup.sh

test: setup
	.venv/bin/python -m pytest -v --durations=15

test-fast: setup
	.venv/bin/python -m pytest -v -m "not e2e"

demo: setup
	bash scripts/demo.sh

clean-venv:
	rm -rf .venv
