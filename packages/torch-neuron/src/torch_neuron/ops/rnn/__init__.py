"""The fused LSTM and GRU cell ops."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from .cells import fused_gru_cell, fused_gru_cell_backward, fused_lstm_cell, fused_lstm_cell_backward_impl

    # cells.py
    impl("_thnn_fused_lstm_cell")(fused_lstm_cell)
    impl("_thnn_fused_lstm_cell_backward_impl")(fused_lstm_cell_backward_impl)
    impl("_thnn_fused_gru_cell")(fused_gru_cell)
    impl("_thnn_fused_gru_cell_backward")(fused_gru_cell_backward)
