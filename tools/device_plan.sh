#!/usr/bin/env bash
# Issue 50's evidence in one device call of at most 600 s (run from the repository root on the lent machine,
# with .whl/ carried: docs/guides/gpu.md). Draw 3 (item 1 was done on 2026-11-27, run 2): every lane shares one
# end (END_AT) and runs side by side on the one GPU and 16 cores:
#   1-2. eager: the cases never run on CUDA, and the cases without a CUDA speed budget (timed against a provisional
#        one, so that their slow controls are timed and the budget is set from what they show);
#   3.   `pytest -m cuda`, then the correct alternatives graded;
#   4-6. compiled (inductor): the cases without a CUDA inductor record.
# Part `second`, for what a first call's time left (about 250 s): `pytest -m cuda` with its failures printed as they
# happen, the alternatives not graded yet, and more of the inductor records.
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
(bash $E eager attention_fully_masked_rows where_nan_grad tied_weights_meta_init params_not_registered eval_mode_mishandled \
    lr_scheduler_verbose dataloader_worker_replicas distributed_sampler_set_epoch dataloader_worker_killed) &
(bash $E eager torch_load_weights_only target_out_of_bounds checkpoint_no_grad inplace_modified backward_twice fp16_grad_underflow \
    loss_broadcast grad_accum_normalization state_dict_aliasing clip_before_unscale batchnorm_single_sample) &
(
    WORKERS=4 bash $E tests
    bash $E grade class_weight_index autocast_device codebook_oob backward_twice target_out_of_bounds inplace_modified \
        where_nan_grad tied_weights_meta_init params_not_registered attention_fully_masked_rows eval_mode_mishandled \
        grad_accum_normalization state_dict_aliasing
) &
(bash $E compiled ddp_unused_parameters loss_broadcast torch_load_weights_only state_dict_prefix where_nan_grad \
    attention_fully_masked_rows) &
(bash $E compiled fp16_grad_underflow clip_before_unscale grad_accum_normalization state_dict_aliasing params_not_registered \
    tied_weights_meta_init) &
(bash $E compiled checkpoint_no_grad batchnorm_single_sample recompile_limit eval_mode_mishandled lr_scheduler_verbose \
    distributed_sampler_set_epoch dataloader_worker_replicas graph_kept_alive) &
fi
wait
rm -f "$out"/*.tgz
tar czf "$out/records.tgz" results/matrix/cuda results/cuda_backends results/cuda_grades 2>/dev/null
(cd "$out" && tar czf logs.tgz -- *.log *.json 2>/dev/null; rm -f -- *.log *.json)
ls -la "$out"
