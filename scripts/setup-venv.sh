#!/usr/bin/env bash
# Create .venv with a Python >= 3.12 (egglog 14 needs it) and install equivci with its test extra.
# With EQUIVCI_CORPUS=0 it skips the corpus extra. Used by the README's first command and by .ci/run. EQUIVCI_PYTHON=/path/to/python overrides the search.
set -euo pipefail
cd "$(dirname "$0")/.."
usable() { "$1" -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1; }
PY=${EQUIVCI_PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.13 python3.12 python3 "$(pyenv root 2>/dev/null)"/versions/3.1[2-9]*/bin/python3; do
    if usable "$cand"; then PY=$cand; break; fi
  done
fi
[ -n "$PY" ] || { echo "setup: no Python >= 3.12 found; install one or set EQUIVCI_PYTHON" >&2; exit 2; }
rm -rf .venv
"$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test]'
# The third-party corpus (about 120 MB, 10-20 s): on unless EQUIVCI_CORPUS=0; its tests skip without it.
if [ "${EQUIVCI_CORPUS:-1}" != 0 ]; then
  .venv/bin/pip install -q -e '.[test,corpus]'
  .venv/bin/pip install -q --no-deps gemma==4.0.1
fi
# An editable install compiles nothing: write equivci's bytecode once, for every process to read (where
# PYTHONDONTWRITEBYTECODE is set none is ever written, and each CLI run and test subprocess compiled the
# whole package again: about 0.3 s of CPU each).
.venv/bin/python -m compileall -q equivci
echo "setup: .venv ready ($(.venv/bin/python --version))"
