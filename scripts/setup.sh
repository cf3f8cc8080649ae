#!/usr/bin/env bash
# One-command setup: .venv, dependencies (engine build picked by hardware), the
# `medstack` command, and the embedded default model. Idempotent: a second run with
# nothing to do takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
  done
fi
VENV=.venv
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ "${MEDSTACK_FORCE_CPU:-0}" != 1 ]; then
  ENGINE=gpu
else
  ENGINE=cpu
fi

if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi

STAMP="$VENV/.medstack-setup"
WANT="$ENGINE $(cat requirements.txt "requirements-$ENGINE.txt" pyproject.toml | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "dependencies up to date ($ENGINE engine)"
else
  step "installing dependencies ($ENGINE engine: requirements-$ENGINE.txt); takes a few minutes the first time"
  EXTRA=()
  if [ -n "${MEDSTACK_EXTRA_INDEX:-}" ]; then EXTRA=(--extra-index-url "$MEDSTACK_EXTRA_INDEX"); fi
  "$VENV/bin/python" -m pip install --progress-bar on "${EXTRA[@]}" -r requirements.txt -r "requirements-$ENGINE.txt" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  if [ "$ENGINE" = cpu ]; then
    # PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch build and break
    # transformers' Gemma 3 import; text serving does not need them.
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  step "installing the medstack command"
  "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e . 2> >(grep -v "is ignored: it is neither" >&2)
  echo "$WANT" > "$STAMP"
fi

# Debian's Chromium, driven headless by the pinned Playwright package (requirements.txt) in the browser tests
# (tests/test_review_chromium.py, tests/test_report_chromium.py: they FAIL without it). Playwright's own browser
# download is never used. MEDSTACK_SKIP_CHROMIUM=1 leaves this step out.
step "checking Chromium (headless; the review-page and report tests drive it)"
if [ "${MEDSTACK_SKIP_CHROMIUM:-0}" = 1 ]; then
  echo "skipped (MEDSTACK_SKIP_CHROMIUM=1): the browser tests fail until a \`chromium\` command exists"
elif command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  echo "chromium present"
elif ! command -v apt-get >/dev/null 2>&1; then
  echo "note: apt-get is not available here; install Chromium yourself (the browser tests need a \`chromium\` command)"
elif [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  echo "installed $(chromium --version 2>/dev/null || echo chromium)"
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo -n env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  echo "installed $(chromium --version 2>/dev/null || echo chromium)"
else
  echo "note: Chromium is missing and installing it needs root: run \`sudo apt-get install chromium\` (the browser tests need it)"
fi

step "checking Slurm (slurm-wlm, munge: the tests run sweeps and fine-tunes on a one-node Slurm, tests/slurm/)"
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }  # the daemons are in /usr/sbin, off a user's PATH
if have sbatch && have slurmctld && have slurmd && have munged; then
  echo "slurm present: $(sbatch --version 2>/dev/null || echo sbatch)"
elif ! command -v apt-get >/dev/null 2>&1; then
  echo "note: apt-get is not available here; install Slurm (slurmctld, slurmd, sbatch) and munge yourself (tests/slurm/ needs them)"
elif [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
  echo "installed $(sbatch --version 2>/dev/null || echo slurm-wlm) and munge"
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo -n env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
  echo "installed $(sbatch --version 2>/dev/null || echo slurm-wlm) and munge"
else
  echo "note: Slurm is missing and installing it needs root: run \`sudo apt-get install slurm-wlm munge\` (used by tests/slurm/)"
fi

step "preparing the embedded default model"
"$VENV/bin/medstack" models prepare embedded
echo
echo "setup done: $VENV/bin/medstack --help"
