"""``nki.isa.constants``: the enums of ``nki.isa`` under the module path NKI also exports them from."""

from .isa import dge_mode, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd

__all__ = ["dge_mode", "engine", "matmul_perf_mode", "nc_version", "oob_mode", "reduce_cmd"]
