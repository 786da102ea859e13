#!/usr/bin/env bash
# The CUDA evidence, run on a lent GPU machine (no network) from the repository root:
#   DEADLINE_S=<s> bash tools/device_evidence.sh eager|backends|speechbrain|tests|diagnose|profile|compiled|grade|suite [case or question ...]
# Lanes run side by side (one GPU, 16 cores) share one end: END_AT=<epoch seconds> in place of DEADLINE_S.
# Wheels for what the machine lacks travel in .whl/ (docs/guides/gpu.md); records land under
# results/matrix/cuda/torch-<version>/ as on CPU; each mode writes $OUT/<mode>.log, and an archive of the
# records ($OUT/<mode>-<pid>.tgz) where it wrote any. TORCH_ERROR_CASES_COMMIT names the commit sent.
set -u
mode=${1:?a mode: eager, backends, speechbrain, tests, diagnose, profile, compiled, grade or suite}; shift
cases=${*:-}
out=${OUT:-/tmp/out}; mkdir -p "$out"
log="$out/$mode.log"; ( set -C; : >"$log" ) 2>/dev/null || log="$out/$mode-$$.log"  # lanes of one mode: a log each
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

if [ ! -e /tmp/site/.installed ] && mkdir /tmp/site.lock 2>/dev/null; then  # lanes started together: one installs
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    touch /tmp/site/.installed
fi
while [ ! -e /tmp/site/.installed ]; do sleep 1; done
export PYTHONPATH=/tmp/site:$PWD
version=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])')
records=results/matrix/cuda/torch-$version

end_at=${END_AT:-$(($(date +%s) + ${DEADLINE_S:-570}))}  # under the device call's 600 s: a step gets at most what is left
step() {  # step <name> <seconds> <command...>: bounded, timed, logged; a step that fails or times out does not stop the rest
    local name=$1 limit=$2; shift 2
    local start=$SECONDS left=$((end_at - $(date +%s) - 20))
    if [ "$left" -lt 30 ]; then echo "=== $name: skipped, ${left}s left" >>"$log"; return; fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s)" >>"$log"
    timeout -k 10 "$limit" "$@" >>"$log" 2>&1
    echo "=== $name: exit $? after $((SECONDS - start))s" >>"$log"
}

{
    echo "mode=$mode cases=${cases:-all} commit=${TORCH_ERROR_CASES_COMMIT:-?}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "triton", triton.__version__, "nccl", torch.cuda.nccl.version())'
    nproc
} >>"$log" 2>&1

glob=${cases:+$(echo "$cases" | tr ' ' ',')}
select=${glob:+"case=$glob"}
select=${select:-"case=glob(*)"}
case $mode in
eager)
    step multirun "${LIMIT_S:-330}" python3 -m harness -m "$select" device=cuda timeout_s=150 \
        "hydra.sweep.dir=$records" 'hydra.sweep.subdir=${case.name}'
    ;;
backends)  # multigpu_segfault's two ranks on one GPU with each process-group backend
    for backend in nccl gloo; do
        step "multigpu_segfault-$backend" 90 python3 -m harness case=multigpu_segfault device=cuda case.backend=$backend \
            'phases=[reproduce,fix,correct]' "hydra.run.dir=results/cuda_backends/torch-$version/$backend"
    done
    ;;
speechbrain)  # autocast_device's upstream tier: the real Brain, on the speechbrain that travelled in .whl
    step speechbrain-tier 60 python3 -m pytest -p no:cacheprovider -q -rA tests/test_autocast_device.py -k brain
    ;;
tests)
    step pytest-cuda 300 python3 -m pytest -m cuda -n "${WORKERS:-4}" -p no:cacheprovider -p tools.pytest_live_failures -q -rA tests/test_cuda.py tests/test_class_weight_index.py \
        tests/test_memory.py tests/test_autocast_device.py tests/test_confine.py
    ;;
diagnose)  # cases: the questions of tools/cuda_diagnostics.py
    step diagnose 300 python3 tools/cuda_diagnostics.py $cases
    ;;
profile)  # the fixes against their CUDA budgets, before and after (tools/cuda_profile_fixes.py)
    step profile 150 python3 tools/cuda_profile_fixes.py --out "$out/cuda_profile.json" $cases
    ;;
compiled)
    step multirun-inductor "${LIMIT_S:-540}" python3 -m harness -m "$select" device=cuda compile=inductor timeout_s=300 \
        "hydra.sweep.dir=$records/inductor" 'hydra.sweep.subdir=${case.name}'
    ;;
grade)
    for name in $cases; do
        step "grade-$name" 150 python3 -m harness case=$name device=cuda fix=tests/fixes/alternatives/$name.py:$name \
            "hydra.run.dir=results/cuda_grades/torch-$version/$name"
    done
    ;;
suite)
    step pytest 540 python3 -m pytest -p no:cacheprovider -q -x --timeout 240 tests
    ;;
*)
    echo "unknown mode $mode: eager, backends, speechbrain, tests, diagnose, profile, compiled, grade or suite" >>"$log"
    ;;
esac
case $mode in eager|backends|compiled|grade) tar czf "$out/$mode-$$.tgz" --exclude='*.pyc' results/matrix/cuda results/cuda_backends results/cuda_grades 2>/dev/null ;; esac
echo "=== done $(date -u +%H:%M:%S)" >>"$log"
