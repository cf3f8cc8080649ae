# medstack: `make setup`, `make test`, `make demo`. See README.md.
.PHONY: setup test test-fast test-distributed demo clean-venv

setup:
	bash scripts/setup.sh

test: setup
	.venv/bin/python -m pytest -v --durations=15 -m "not distributed"

# several vLLM processes at once (up to four servers' memory): replica group + router, TP=2, Ray
test-distributed: setup
	.venv/bin/python -m pytest -v --durations=15 -m distributed

test-fast: setup
	.venv/bin/python -m pytest -v -m "not e2e"

demo: setup
	bash scripts/demo.sh

clean-venv:
	rm -rf .venv
