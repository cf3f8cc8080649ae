# medstack: `make setup`, `make test`, `make demo`. See README.md.
.PHONY: setup test test-fast test-distributed demo clean-venv

setup:
	bash scripts/setup.sh

test: setup
	.venv/bin/python -m pytest -v --durations=15 -m "not distributed"

# several vLLM processes for one model (up to three servers' memory): TP=2 and Ray (tests marked distributed);
# the replica group behind the router is in `make test`
test-distributed: setup
	.venv/bin/python -m pytest -v --durations=15 -m distributed

test-fast: setup
	.venv/bin/python -m pytest -v -m "not e2e"

demo: setup
	bash scripts/demo.sh

clean-venv:
	rm -rf .venv
