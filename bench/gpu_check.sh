#!/usr/bin/env bash
# The GPU checks in one command, for a machine with an NVIDIA GPU, CuPy and PyTorch but no MPI
# and no network: the GPU tests (pytest -k gpu) and bench/gpu.py, each section on its own so a
# failure in one keeps the others. Logs go to $OUT (default ./gpu-out).
#
#   bash bench/gpu_check.sh              # tests, then sections b, e, a, c of bench/gpu.py
#   GPU_TESTS=0 bash bench/gpu_check.sh  # benchmarks only
#   GPU_TEST_PATHS="tests/test_kernels.py" GPU_SECTIONS="b e" bash bench/gpu_check.sh
#
# MPI comes from the mpich and mpi4py wheels in .whl/ (downloaded beforehand for the
# machine's Python: docs/gpu.md), installed into a virtual environment that also sees the
# system Python's packages (CuPy, PyTorch) through a .pth file.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
PY=python3
if ls .whl/mpich-*.whl >/dev/null 2>&1; then
    python3 -m venv /tmp/gpu-venv
    site=$(python3 -c "import site; print(site.getsitepackages()[0])")
    venv_site=$(/tmp/gpu-venv/bin/python -c "import site; print(site.getsitepackages()[0])")
    echo "$site" >"$venv_site/system-site.pth"
    /tmp/gpu-venv/bin/python -m pip install -q --no-index --no-deps .whl/*.whl
    PY=/tmp/gpu-venv/bin/python
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import cupy, torch, numpy; from mpi4py import MPI
print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)
print(MPI.Get_library_version().splitlines()[0])" 2>&1 | tee -a "$OUT/gpu.txt"
if [ "${GPU_TESTS:-1}" != 0 ]; then
    timeout "${GPU_TEST_SECONDS:-300}" $PY -m pytest -q -k gpu -rfEs -p no:cacheprovider \
        ${GPU_TEST_PATHS:-tests/} >"$OUT/tests.log" 2>&1
    echo "pytest -k gpu: exit $?"
    grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
    grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
fi
for section in ${GPU_SECTIONS-b e a c}; do
    timeout "${GPU_BENCH_SECONDS:-150}" $PY bench/gpu.py --only "$section" ${GPU_BENCH_ARGS:-} \
        >"$OUT/bench-$section.log" 2>&1
    echo "bench/gpu.py --only $section: exit $?"
    tail -n 30 "$OUT/bench-$section.log"
done
