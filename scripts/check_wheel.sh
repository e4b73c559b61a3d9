#!/usr/bin/env bash
# Build memledger's wheel, install it (not editable) into a fresh virtual environment, and run each command
# once from outside the checkout: what a user who runs `pip install memledger-*.whl` gets.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$work/dist" "$root"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet "$work"/dist/memledger-*.whl
cd "$work"                                   # not the checkout: only the installed wheel can be imported
export MEMLEDGER_CACHE_DIR="$work/cache"
ml="$work/venv/bin/memledger"
"$work/venv/bin/python" - "$root" <<'PY'
import pathlib, sys
import memledger
installed = pathlib.Path(memledger.__file__).resolve()
assert not installed.is_relative_to(pathlib.Path(sys.argv[1]).resolve()), f"memledger imported from the checkout: {installed}"
PY
"$ml" ledger --preset llama2-7b --json > /dev/null
"$ml" ledger --preset mistral-7b --zero 3 --dp 8 > /dev/null
"$ml" step --preset llama2-7b --json > /dev/null
"$ml" fit --preset llama2-7b --zero 3 --dp 8 --vary batch > /dev/null
"$ml" infer --preset llama3-8b --batch 8 --seq 8192 > /dev/null
"$ml" compare --preset llama2-7b > /dev/null
"$ml" claims --json > /dev/null
"$ml" presets > /dev/null
"$ml" recipes > /dev/null
"$ml" check "$root/tests/intake/configs/torchtune_llama2_7B_lora_single_device_2bd69062.yaml" tokenizer.max_seq_len=4096 > /dev/null
"$ml" check "$root/tests/intake/configs/torchtitan_llama3_8b.toml" --gpus 64 --json > /dev/null
"$ml" ledger --preset llama2-7b --measure reserved --json > /dev/null
"$work/venv/bin/python" -m memledger ledger --params 7e9 --zero 3 --dp 64 > /dev/null
echo "wheel: $(basename "$work"/dist/memledger-*.whl) installed and every command ran"
