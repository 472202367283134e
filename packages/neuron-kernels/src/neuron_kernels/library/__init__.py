"""The kernel library: one module per family. Each public kernel is an ``@nk.kernel`` function."""
