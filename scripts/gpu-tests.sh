# The test executables scripts/gpu-check.sh runs: the ones that skip without a CUDA device
# (NCCL) and the ones whose services pin with CUDA where a device exists (master views, the
# arena, the tiers, the ZeRO equivalences and their bench), with the thread-count and
# train-vs-trainer-role checks. Sourced by gpu-check.sh and gpu-bundle.sh.
GPU_TESTS=(test_nccl_collectives test_nccl_trainer test_offload_arena test_offload_arena_handoff
  test_offload_tiers test_zero_engine test_bench_zero test_kernel_threads test_cli_train)
