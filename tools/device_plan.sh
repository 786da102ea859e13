#!/usr/bin/env bash
# Issue 50's evidence in one device call of at most 600 s (run from the repository root on the lent machine,
# with .whl/ carried: docs/guides/gpu.md). In order of value, sharing one end (END_AT):
#   1. the quiet part: tools/cuda_profile_fixes.py (the fixes against their CUDA budgets, before and after),
#      then embedding_oob, class_weight_index and autocast_device eager, alone on the GPU;
#   2. three lanes side by side: the other cases eager, then `pytest -m cuda`; more cases eager, then the
#      correct alternatives graded; the cases without a CUDA inductor record, compiled.
# Everything lands in $OUT as two archives: logs.tgz (logs, cuda_profile.json) and records.tgz (results/).
#   TORCH_ERROR_CASES_COMMIT=<sha> bash tools/device_plan.sh [seconds, default 540]
set -u
export END_AT=$(($(date +%s) + ${1:-540}))
out=${OUT:-/tmp/out}; mkdir -p "$out"
E=tools/device_evidence.sh

bash $E profile
LIMIT_S=110 bash $E eager embedding_oob class_weight_index autocast_device
(
    bash $E eager batchnorm_single_sample checkpoint_no_grad fp16_grad_underflow loss_broadcast state_dict_prefix \
        torch_load_weights_only recompile_limit dataloader_worker_killed clip_before_unscale
    WORKERS=6 bash $E tests
) &
(
    bash $E eager backward_twice codebook_oob ddp_unused_parameters graph_kept_alive inplace_modified multigpu_segfault target_out_of_bounds \
        grad_accum_normalization state_dict_aliasing
    bash $E grade embedding_oob class_weight_index autocast_device backward_twice codebook_oob target_out_of_bounds inplace_modified
) &
(
    bash $E compiled inplace_modified graph_kept_alive ddp_unused_parameters torch_load_weights_only state_dict_prefix \
        fp16_grad_underflow loss_broadcast clip_before_unscale grad_accum_normalization state_dict_aliasing
) &
wait
rm -f "$out"/*.tgz
tar czf "$out/records.tgz" results/matrix/cuda results/cuda_backends results/cuda_grades 2>/dev/null
(cd "$out" && tar czf logs.tgz -- *.log *.json && rm -f -- *.log *.json)
ls -la "$out"
