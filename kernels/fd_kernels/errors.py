"""Errors of fd_kernels. Leaf module: imports nothing, so the engine can name them without loading Paddle."""


class KernelBuildError(Exception):
    """The C++ operators could not be compiled or loaded."""
