"""fd's C++ CPU operators for Paddle; `fd_kernels.ops` has the ops, `fdcli_engine.ops.reference` the oracles."""
