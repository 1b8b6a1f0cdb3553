"""fd's C++ CPU operators for Paddle, and the interface they own.

- `fd_kernels.native`: the Python bindings of the C++ operators (csrc/), built by `fd_kernels.build`;
- `fd_kernels.reference`: the same ops in pure Paddle (numpy for the sampler), the test oracle;
- `fd_kernels.sampler_layout`: the sampler's row layout; `fd_kernels.packing`: the packed weight formats;
- `fd_kernels.errors`: `KernelBuildError`.

This package imports nothing from the engine (an import-linter contract holds it).
"""
