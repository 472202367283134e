"""Resampling: interpolate's forwards and backward, grid_sample of 5-d inputs."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from ..core.variants import write_out
    from . import upsample, upsample_backward
    from .grid_sample import grid_sampler_2d, grid_sampler_3d
    from .upsample import _forward
    from .upsample_backward import _backward, _grad_input_variant

    # grid_sample.py
    impl("grid_sampler_3d")(grid_sampler_3d)
    impl("grid_sampler_2d")(grid_sampler_2d)

    # upsample.py
    for _name, (_mode, _spatial) in upsample.OPS.items():
        _kernel = _forward(getattr(upsample.aten, _name).default, _name, _mode, _spatial)
        impl(_name)(_kernel)
        impl(f"{_name}.out")(lambda *args, out, _k=_kernel: write_out(out, _k(*args)))

    # upsample_backward.py
    for _name, (_mode, _spatial, _align) in upsample_backward.OPS.items():
        _kernel = _backward(getattr(upsample_backward.aten, _name).default, _name, _mode, _spatial, _align)
        impl(_name)(_kernel)
        impl(f"{_name}.grad_input")(_grad_input_variant(_kernel))
