"""``nki.typing``: annotations of NKI kernels (``tensor``, ``tensor[shape, dtype]``) — the tracer's tensor type;
subscripting it gives it back (annotations are not checked at trace time, as in NKI)."""

from ..tensors import View


class _TensorAnnotation:
    def __getitem__(self, _):
        return View

    def __repr__(self) -> str:
        return "nki.typing.tensor"


tensor = _TensorAnnotation()

__all__ = ["tensor"]
