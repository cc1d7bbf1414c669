#!/usr/bin/env bash
# What a CUDA machine shows of trainyard.parallel, in under 8 minutes (bench/gpu_check.py
# says what each section measures):
#
#     bash bench/gpu_check.sh                          # on a machine with CUDA
#     bash bench/gpu_check.sh --device cpu --quick     # the same code on CPU and gloo
#
# Prints a header (torch, CUDA, the GPUs), then the sections. Without CUDA it says so and
# exits 0. GPU_CHECK_PYTHON picks the interpreter (default: the repository's .venv, else
# python3); GPU_CHECK_TIMEOUT the global limit in seconds (default 480).
set -euo pipefail

if [[ -z "${GPU_CHECK_UNDER_TIMEOUT:-}" ]]; then
    # One limit for the whole check; timeout signals its whole process group, torchrun's
    # workers included.
    export GPU_CHECK_UNDER_TIMEOUT=1
    exec timeout --kill-after=15 "${GPU_CHECK_TIMEOUT:-480}" bash "$0" "$@"
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ -n "${GPU_CHECK_PYTHON:-}" ]]; then
    python="$GPU_CHECK_PYTHON"
elif [[ -x .venv/bin/python ]]; then
    python=.venv/bin/python
else
    python=python3
fi

echo "== gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) CPUs, python: $python"
"$python" - <<'EOF'
import torch

cuda = torch.cuda.is_available()
print(f"torch {torch.__version__}, built for CUDA {torch.version.cuda or '(none: a CPU-only build)'}, "
      f"CUDA available: {cuda}")
if cuda:
    try:
        nccl = torch.cuda.nccl.version()
        nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as exc:  # the header must not stop the check
        nccl = f"unknown ({type(exc).__name__})"
    print(f"NCCL {nccl}, bf16 supported: {torch.cuda.is_bf16_supported()}")
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        print(f"GPU {index}: {properties.name}, {properties.total_memory / 2**30:.0f} GiB, "
              f"compute capability {properties.major}.{properties.minor}")
    print(f"{torch.cuda.device_count()} GPU(s)")
EOF
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi failed"
else
    echo "nvidia-smi: not present"
fi

exec "$python" bench/gpu_check.py "$@"
