#!/usr/bin/env bash
# Issue 50's evidence in one device call of at most 600 s (run from the repository root on the lent machine,
# with .whl/ carried: docs/guides/gpu.md). Lanes side by side on the one GPU and 16 cores share one end (END_AT).
# The next draw (what runs 3 and 4 of 2026-11-27 left, results/cuda_evidence/2026-11-27/README.md):
#   1. `pytest -m cuda` whole, failures printed as they happen; then the alternatives not graded on CUDA yet;
#   2-3. inductor for the cases without a complete CUDA inductor record, one case at a time per lane;
#   4. zero_grad_set_to_none eager (new, never on CUDA), dataloader_worker_killed eager (its memory phase is long), then
#      more alternatives.
# Part `second`, for what a first call's time leaves (about 250 s): as run 4 ran it.
# Everything lands in $OUT as two archives: logs.tgz (logs) and records.tgz (results/).
#   TORCH_ERROR_CASES_COMMIT=<sha> bash tools/device_plan.sh [seconds, default 530] [first|second]

set -u
export END_AT=$(($(date +%s) + ${1:-530}))
out=${OUT:-/tmp/out}; mkdir -p "$out"
E=tools/device_evidence.sh
export LIMIT_S=600  # each step is cut at END_AT anyway

if [ "${2:-first}" = second ]; then
    (WORKERS=6 bash $E tests) &
    (bash $E grade backward_twice where_nan_grad tied_weights_meta_init params_not_registered grad_accum_normalization) &
    (bash $E grade target_out_of_bounds inplace_modified attention_fully_masked_rows eval_mode_mishandled state_dict_aliasing) &
    (bash $E compiled where_nan_grad attention_fully_masked_rows params_not_registered) &
    (bash $E compiled tied_weights_meta_init eval_mode_mishandled distributed_sampler_set_epoch) &
else
    (
        WORKERS=6 bash $E tests
        bash $E grade autocast_device codebook_oob grad_accum_normalization batchnorm_single_sample checkpoint_no_grad \
            clip_before_unscale fp16_grad_underflow loss_broadcast
    ) &
    (bash $E compiled attention_fully_masked_rows batchnorm_single_sample checkpoint_no_grad dataloader_worker_replicas \
        distributed_sampler_set_epoch eval_mode_mishandled graph_kept_alive) &
    (bash $E compiled lr_scheduler_verbose params_not_registered recompile_limit state_dict_aliasing state_dict_prefix \
        dataloader_worker_killed) &
    (
        bash $E eager zero_grad_set_to_none  # the 30th case, not yet run on CUDA (its budget there is null)
        LIMIT_S=200 bash $E eager dataloader_worker_killed
        bash $E grade torch_load_weights_only state_dict_prefix lr_scheduler_verbose distributed_sampler_set_epoch \
            dataloader_worker_replicas recompile_limit ddp_unused_parameters multigpu_segfault graph_kept_alive \
            dataloader_worker_killed
    ) &
fi
wait
rm -f "$out"/*.tgz
tar czf "$out/records.tgz" results/matrix/cuda results/cuda_backends results/cuda_grades 2>/dev/null
(cd "$out" && tar czf logs.tgz -- *.log *.json 2>/dev/null; rm -f -- *.log *.json)
ls -la "$out"
