"""One program for a pointwise formula (the composite activations, their backward helpers, lerp, addcmul, ...),
for several formulas over shared inputs, for a formula over a tensor list, and for a masked recurrence.

The library's elementwise kernels are one op each; torch's composite pointwise ops (hardswish, gelu's
backward, addcdiv, ...) are formulas of several. Running such a formula as a chain of library kernels
would round every intermediate to the tensor dtype (torch computes bfloat16/float16 formulas in float32
and rounds once) and pay a launch and an HBM round trip per step. So a formula is written once with
``Expr`` (Python operators and functions over inputs and constants), and ``formula`` traces it through
the library's elementwise tiler (broadcasting, tiling, loop order: ``elementwise.run_elementwise``): each
tile loads the inputs, evaluates every node once into an FP32 tile (VectorE ALU ops, ScalarE
activations, selects) and rounds the root once into the result dtype.

Expressions are plain nested tuples (compile-time constants of the kernel, so one trace per formula,
shapes and dtypes): ``("x", i)`` input ``i``; a Python number; ``("alu", op, a, b)`` a VectorE ALU op
(``neuron_hal.Alu``); ``("act", func, a, scale)`` a ScalarE activation of ``a * scale``
(``neuron_hal.Act``); ``("select", p, a, b)`` a where ``p`` is nonzero; ``("round", dtype, a)`` ``a``
rounded to ``dtype`` and read back (torch's intermediate roundings). Inputs are float tensors or
masks (bool/uint8); integer formulas are not expressible here (FP32 is inexact above 2**24).
"""

from __future__ import annotations

import inspect

from neuron_hal import Act, Alu, DType

from .. import isa as nisa
from .. import language as nl
from ..errors import KernelError
from ..jit import kernel
from . import elementwise as ew
from . import movement

F32 = DType.float32
MAX_INPUTS = 4  # tensors of one formula (x0..x3)


class Expr:
    """A formula node with Python operators: ``+ - * /`` (both ways), comparisons through methods."""

    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node

    def _bin(self, op, other, swap=False):
        a, b = self.node, node_of(other)
        return Expr(("alu", op, b, a) if swap else ("alu", op, a, b))

    def __add__(self, o):
        return self._bin("add", o)

    def __radd__(self, o):
        return self._bin("add", o, True)

    def __sub__(self, o):
        return self._bin("subtract", o)

    def __rsub__(self, o):
        return self._bin("subtract", o, True)

    def __mul__(self, o):
        return self._bin("multiply", o)

    def __rmul__(self, o):
        return self._bin("multiply", o, True)

    def __truediv__(self, o):
        return self._bin("divide", o)

    def __rtruediv__(self, o):
        return self._bin("divide", o, True)

    def __neg__(self):
        return self._bin("multiply", -1.0)

    def lt(self, o):
        return self._bin("less", o)

    def le(self, o):
        return self._bin("less_equal", o)

    def gt(self, o):
        return self._bin("greater", o)

    def ge(self, o):
        return self._bin("greater_equal", o)

    def eq(self, o):
        return self._bin("equal", o)

    def ne(self, o):
        return self._bin("not_equal", o)

    def isnan(self):
        return self.ne(self)


def node_of(v):
    if isinstance(v, Expr):
        return v.node
    if isinstance(v, bool | int | float):
        return float(v)
    raise TypeError(f"not an expression operand: {v!r}")


def inputs(n: int) -> list[Expr]:
    return [Expr(("x", i)) for i in range(n)]


def act(func: str, x: Expr, scale: float = 1.0) -> Expr:
    """ScalarE activation ``func(x * scale)``."""
    return Expr(("act", func, x.node, float(scale)))


def where(p: Expr, a, b) -> Expr:
    return Expr(("select", node_of(p), node_of(a), node_of(b)))


def rounded(a: Expr, dtype) -> Expr:
    """``a`` rounded to ``dtype`` (a device dtype or its name) and read back: torch's intermediate roundings."""
    return Expr(("round", str(DType.of(dtype)), a.node))


def maximum(a: Expr, b) -> Expr:
    return a._bin("max", b)


def minimum(a: Expr, b) -> Expr:
    return a._bin("min", b)


def fmod(a: Expr, b) -> Expr:
    return a._bin("mod", b)


def abs_(a: Expr) -> Expr:
    return a._bin("abs_max", 0.0)


# -- the kernel --------------------------------------------------------------------------------------------
class _Eval:
    """Evaluates one tile's nodes, each once (a formula reuses subexpressions: x in gelu's backward)."""

    def __init__(self, ctx, ins):
        self.ctx, self.ins, self.memo = ctx, ins, {}

    def __call__(self, node, dst=None) -> ew.Loaded:
        if isinstance(node, float):
            if dst is None:
                return ew.Loaded(F32, imm=node)
            nisa.memset(dst, node)
            return ew.val(dst)
        if node[0] == "x" and dst is None:
            return self.ins[node[1]]
        hit = self.memo.get(node) if dst is None else None
        if hit is None:
            hit = self.memo[node] = ew.val(self._emit(node, dst or self.ctx.tile(F32)))
        return hit

    def _tile_of(self, node) -> ew.Loaded:
        """An operand that must be a tile (activation input, select's true side)."""
        v = self(node)
        if v.full is None:
            t = self.ctx.tile(F32)
            nisa.memset(t, v.imm)
            return ew.val(t)
        return v

    def _emit(self, node, dst):
        kind = node[0]
        if kind == "x":
            nisa.tensor_copy(dst, self.ins[node[1]].full)
        elif kind == "alu":
            a, b = self(node[2]), self(node[3])
            if a.full is None and b.full is None:
                raise KernelError(f"formula node {node!r} has no tensor operand (fold constants first)")
            ew.emit(dst, a, b, Alu(node[1]))
        elif kind == "act":
            nisa.activation(dst, Act(node[1]), self._tile_of(node[2]).full, scale=node[3])
        elif kind == "round":
            r = self.ctx.tile(DType.of(node[1]))
            nisa.tensor_copy(r, self._tile_of(node[2]).full)
            nisa.tensor_copy(dst, r)
        elif kind == "select":
            p, a, b = self._tile_of(node[1]), self._tile_of(node[2]), self(node[3])
            nisa.select(dst, p.full, a.full, b.full if b.full is not None else b.imm)
        else:
            raise KernelError(f"unknown formula node {node!r}")
        return dst


def _count(node, seen) -> int:
    if isinstance(node, float) or node[0] == "x" or node in seen:
        return 0
    seen.add(node)
    return 1 + sum(_count(c, seen) for c in node[1:] if isinstance(c, tuple))


@kernel(name="pointwise_formula", tunables={"tile_bytes": ew.TILE_BYTES})
def formula(x0, x1=None, x2=None, x3=None, expr=None, out_dtype=None, tile_bytes=ew.TILE_BYTES[0]):
    """``expr`` (nested tuples, module docstring) over the broadcast inputs x0..x3, rounded once to
    ``out_dtype``."""
    ops = [ew.operand(x, "formula", f"x{i}") for i, x in enumerate((x0, x1, x2, x3)) if x is not None]
    shape = ew.broadcast_shapes(*[o.shape for o in ops], op="formula")

    def body(ctx, ins):
        out = ctx.tile(out_dtype)
        _Eval(ctx, ins)(expr, dst=out)
        return [out]

    temps = _count(expr, set())
    return ew.run_elementwise("formula", shape, ops, [out_dtype], body, tile_bytes, temps=temps)[0]


# -- formulas known by name ------------------------------------------------------------------------------------
_NAMED: dict[str, tuple] = {}


def define_named(key: str, build) -> str:
    """Remember the formula ``build()`` under the unique name ``key`` (built once) for ``named_formula``, whose
    constant is then the short key instead of the tree: launches hash their constants on every call, and a large
    formula (special functions: hundreds of nodes sharing subtrees) would cost milliseconds per call."""
    if key not in _NAMED:
        _NAMED[key] = build().node
    return key


@kernel(name="pointwise_named_formula", tunables={"tile_bytes": ew.TILE_BYTES})
def named_formula(x0, x1=None, x2=None, x3=None, key=None, out_dtype=None, tile_bytes=ew.TILE_BYTES[0]):
    """``formula`` over the formula named ``key`` (see ``define_named``)."""
    return formula.fn(x0, x1, x2, x3, expr=_NAMED[key], out_dtype=out_dtype, tile_bytes=tile_bytes)


# -- several formulas over shared inputs: the fused regions of a compiled graph ---------------------------------
MAX_GRAPH_INPUTS = 8


@kernel(name="pointwise_graph", tunables={"tile_bytes": ew.TILE_BYTES})
def graph_formula(x0, x1=None, x2=None, x3=None, x4=None, x5=None, x6=None, x7=None, exprs=(), out_dtypes=(),
                  tile_bytes=ew.TILE_BYTES[0]):
    """Each of ``exprs`` over the broadcast inputs x0..x7, evaluated in one pass over the tiles (shared
    subexpressions once) and rounded once to its ``out_dtypes`` entry: one program for a chain of elementwise
    ops whose several values are needed outside it."""
    xs = (x0, x1, x2, x3, x4, x5, x6, x7)
    ops = [ew.operand(x, "graph_formula", f"x{i}") for i, x in enumerate(xs) if x is not None]
    shape = ew.broadcast_shapes(*[o.shape for o in ops], op="graph_formula")

    def body(ctx, ins):
        ev = _Eval(ctx, ins)
        outs = []
        for e, d in zip(exprs, out_dtypes):
            out = ctx.tile(d)
            if DType.of(d) is F32 and isinstance(e, tuple) and e[0] != "x" and e not in ev.memo:
                ev(e, dst=out)  # an FP32 output tile is also the node's value for the later formulas
            else:  # other dtypes round a copy: later formulas read the FP32 value, not the rounded one
                v = ev._tile_of(e) if isinstance(e, tuple) else ev(e)
                nisa.tensor_copy(out, v.full) if v.full is not None else nisa.memset(out, v.imm)
            outs.append(out)
        return outs

    seen: set = set()
    temps = sum(_count(e, seen) for e in exprs)
    return ew.run_elementwise("graph_formula", shape, ops, list(out_dtypes), body, tile_bytes, temps=temps)


# -- one formula over every tensor of a list: the _foreach_ ops ---------------------------------------------------
_FOREACH: dict = {}


def foreach_formula(n: int, arity: int, scalars: bool):
    """The kernel evaluating ``expr`` for each of ``n`` index positions over inputs ``x{j}_{i}`` (j < arity)
    and, with ``scalars``, the float32 ``scalars[i]`` as input ``arity``: one program for a whole tensor list
    (a launch per tensor would pay the fixed cost of a program n times: 52 step counters of an AdamW step).
    In place (``inplace=True``) results go to ``x0_i``; otherwise the kernel returns n new tensors. Tensors
    are laid out largest first (a tile ring sized by its first, largest tiles takes the smaller ones)."""
    key = (n, arity, scalars)
    if key not in _FOREACH:
        P = inspect.Parameter
        params = [P(f"x{j}_{i}", P.POSITIONAL_OR_KEYWORD) for j in range(arity) for i in range(n)]
        params += [P("scalars", P.POSITIONAL_OR_KEYWORD)] if scalars else []
        params += [P(k, P.KEYWORD_ONLY, default=v) for k, v in
                   (("expr", None), ("out_dtype", None), ("inplace", False), ("tile_bytes", ew.TILE_BYTES[0]))]

        def body(**kw):
            expr, out_dtype, inplace = kw["expr"], kw["out_dtype"], kw["inplace"]
            firsts = [kw[f"x0_{i}"] for i in range(n)]
            if _is_float_cast(expr, firsts, out_dtype) and arity == 1 and not (scalars or inplace):
                return tuple(_cast(x, out_dtype) for x in firsts)  # one DMA each, in the given order
            order = sorted(range(n), key=lambda i: -_numel(firsts[i].shape))
            outs = [None] * n
            for i in order:
                xs = [kw[f"x{j}_{i}"] for j in range(arity)]
                if scalars:  # s[i] as a 0-d operand of a 0-d tensor, else a [1] one that broadcasts
                    xs.append(kw["scalars"][i] if len(firsts[i].shape) == 0 else kw["scalars"][i:i + 1])
                ops = [ew.operand(x, "foreach", f"x{j}") for j, x in enumerate(xs)]
                shape = tuple(firsts[i].shape)
                out = firsts[i] if inplace else nl.ndarray(shape, out_dtype, buffer=nl.hbm, name=f"out{i}")
                outs[i] = out

                def tile_body(ctx, ins):
                    t = ctx.tile(out_dtype)
                    _Eval(ctx, ins)(expr, dst=t)
                    return [t]

                ew.Tiler("foreach", shape, ops, [out_dtype], kw["tile_bytes"], temps=_count(expr, set())).run(
                    tile_body, [out])
            return None if inplace else tuple(outs)

        body.__signature__ = inspect.Signature(params)
        _FOREACH[key] = kernel(body, name=f"foreach_formula_{arity}x{n}{'_s' if scalars else ''}",
                               tunables={"tile_bytes": ew.TILE_BYTES})
    return _FOREACH[key]


def _is_float_cast(expr, xs, out_dtype) -> bool:
    """Whether the formula is its input (or its input rounded to the output dtype), cast between float dtypes
    (autocast's weight casts): what a DMA does."""
    out_dtype = DType.of(out_dtype)
    return (expr in (("x", 0), ("round", str(out_dtype), ("x", 0))) and out_dtype.is_float
            and all(x.dtype.is_float for x in xs))


def _cast(x, out_dtype):
    out = nl.ndarray(tuple(x.shape), out_dtype, buffer=nl.hbm, name="cast")
    if _numel(x.shape):
        movement.move(out, x)
    return out


def _numel(shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


# -- a masked recurrence: the orthogonal polynomials of torch.special -----------------------------------------------
class Recurrence:
    """A recurrence over ``x`` and a degree ``n`` (both broadcast): ``pre`` the formulas of (x, n) evaluated once
    per element, the first two being the degree and q at degree 1 and the rest extra step inputs; ``step(j)`` the
    formulas of step j (1-based) giving the new (p, q) over inputs (x, degree, p, q, *extras); ``final`` the result
    over (x, degree, p, q). p starts at 1."""

    def __init__(self, pre, step, final):
        self.pre, self.step, self.final = pre, step, final


_RECURRENCES: dict[str, Recurrence] = {}


def define_recurrence(key: str, recurrence: Recurrence) -> str:
    """Remember ``recurrence`` under the unique name ``key`` for the ``polynomial`` kernel."""
    _RECURRENCES.setdefault(key, recurrence)
    return key


class _Pool:
    """Scratch tiles for the recurrence steps: step j evaluates into pool j % 2, reusing its tiles from step j - 2
    (whose values are dead by then: a step reads only the previous step's p and q). Thousands of single-use tiles
    would cost the tile allocator more than the whole trace otherwise."""

    def __init__(self, ctx):
        self.ctx, self.tiles, self.used = ctx, [], 0

    def reset(self) -> _Pool:
        self.used = 0
        return self

    def tile(self, dtype):
        if self.used == len(self.tiles):
            self.tiles.append(self.ctx.tile(dtype))
        t = self.tiles[self.used]
        if t.dtype != DType.of(dtype):
            raise KernelError(f"polynomial step scratch tile is {t.dtype}, wanted {dtype}")
        self.used += 1
        return t


@kernel(name="pointwise_polynomial", tunables={"tile_bytes": ew.TILE_BYTES})
def polynomial(x, n, key=None, steps=0, out_dtype=None, tile_bytes=ew.TILE_BYTES[0]):
    """Recurrence ``key`` (``define_recurrence``) of x at degree n (broadcast), with ``steps`` masked steps."""
    rec = _RECURRENCES[key]
    ops = [ew.operand(x, key, "x"), ew.operand(n, key, "n")]
    shape = ew.broadcast_shapes(ops[0].shape, ops[1].shape, op=key)
    pre, final = rec.pre, rec.final
    steps_of = [rec.step(j) for j in range(1, steps + 1)]

    def body(ctx, ins):
        ev = _Eval(ctx, ins)  # one evaluator: the subexpressions pre's formulas share are computed once
        nt, q, *a = [ev(e.node) for e in pre]
        one = ctx.tile(F32)
        nisa.memset(one, 1.0)
        p = ew.val(one)
        pools = (_Pool(ctx), _Pool(ctx))
        for j, (new_p, new_q) in enumerate(steps_of):
            ev = _Eval(pools[j % 2].reset(), [ins[0], nt, p, q, *a])
            p, q = ev(new_p.node), ev(new_q.node)
        out = ctx.tile(out_dtype)
        _Eval(ctx, [ins[0], nt, p, q])(final.node, dst=out)
        return [out]

    temps = sum(_count(e.node, set()) for e in pre) + _count(final.node, set()) + 3
    if steps_of:
        seen: set = set()
        temps += 2 * sum(_count(e.node, seen) for e in steps_of[-1])  # the two pools
    return ew.run_elementwise(key, shape, ops, [out_dtype], body, tile_bytes, temps=temps)[0]
