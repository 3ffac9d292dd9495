# The programs scripts/gpu_tests.sh runs, as paths in a build directory.
# Sourced by gpu_tests.sh (what a carried build must hold), gpu_bundle.sh
# (what a bundle carries) and gpu_device.sh (what must load there).
gpu_programs=(src/runner/erun tests/collectives_nccl_test tests/collectives_staged_test tests/state_gpu_test
              tests/worker_gpu_plan_test examples/gpu/train_mlp_gpu bench/gpu_allreduce_bench bench/gpu_commit_bench)
# Built only with NCCL: its step is skipped where it is missing.
gpu_programs_nccl=(bench/nccl_shrink_bench)
