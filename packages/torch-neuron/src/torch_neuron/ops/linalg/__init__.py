"""Linear algebra: matrix products on TensorE, factorizations and solvers composed from device ops, distances."""

from __future__ import annotations


def register(lib) -> None:
    """Register the family's ops: each aten overload and its kernel, the bodies in the modules."""
    from ..core.registry import impl
    from .cholesky import (
        cholesky,
        cholesky_out,
        linalg_cholesky_ex,
        linalg_cholesky_ex_out,
        linalg_solve_triangular,
        linalg_solve_triangular_out,
        triangular_solve,
        triangular_solve_out,
    )
    from .distance import cdist_forward, pdist_forward
    from .eig import linalg_eigh, linalg_eigh_out, linalg_svd, linalg_svd_out
    from .lstsq import linalg_lstsq, linalg_lstsq_out
    from .lu import linalg_lu, linalg_lu_factor_ex, linalg_lu_factor_ex_out, linalg_lu_out, lu_unpack, lu_unpack_out
    from .matmul import (
        addbmm,
        addbmm_,
        addbmm_out,
        addmm,
        addmm_,
        addmm_out,
        addmv,
        addmv_,
        addmv_out,
        addr,
        addr_,
        addr_out,
        baddbmm,
        baddbmm_,
        baddbmm_out,
        bmm,
        bmm_out,
        dot,
        dot_out,
        mm,
        mm_out,
        mv,
        mv_out,
        vdot,
        vdot_out,
    )
    from .qr import (
        geqrf,
        geqrf_out,
        householder_product,
        householder_product_out,
        linalg_qr,
        linalg_qr_out,
        ormqr,
        ormqr_out,
    )
    from .solve import (
        cholesky_inverse,
        cholesky_inverse_out,
        cholesky_solve_helper,
        linalg_det,
        linalg_det_out,
        linalg_inv_ex,
        linalg_inv_ex_out,
        linalg_lu_solve,
        linalg_lu_solve_out,
        linalg_slogdet,
        linalg_slogdet_out,
        linalg_solve_ex,
        linalg_solve_ex_out,
    )

    # cholesky.py
    impl("linalg_cholesky_ex")(linalg_cholesky_ex)
    impl("linalg_cholesky_ex.L")(linalg_cholesky_ex_out)
    impl("cholesky")(cholesky)
    impl("cholesky.out")(cholesky_out)
    impl("linalg_solve_triangular")(linalg_solve_triangular)
    impl("linalg_solve_triangular.out")(linalg_solve_triangular_out)
    impl("triangular_solve")(triangular_solve)
    impl("triangular_solve.X")(triangular_solve_out)

    # distance.py
    impl("_cdist_forward")(cdist_forward)
    impl("_pdist_forward")(pdist_forward)

    # eig.py
    impl("_linalg_eigh")(linalg_eigh)
    impl("_linalg_eigh.eigenvalues")(linalg_eigh_out)
    impl("_linalg_svd")(linalg_svd)
    impl("_linalg_svd.U")(linalg_svd_out)

    # lstsq.py
    impl("linalg_lstsq")(linalg_lstsq)
    impl("linalg_lstsq.out")(linalg_lstsq_out)

    # lu.py
    impl("linalg_lu_factor_ex")(linalg_lu_factor_ex)
    impl("linalg_lu_factor_ex.out")(linalg_lu_factor_ex_out)
    impl("lu_unpack")(lu_unpack)
    impl("lu_unpack.out")(lu_unpack_out)
    impl("linalg_lu")(linalg_lu)
    impl("linalg_lu.out")(linalg_lu_out)

    # matmul.py
    impl("mm")(mm)
    impl("mm.out")(mm_out)
    impl("bmm")(bmm)
    impl("bmm.out")(bmm_out)
    impl("addmm")(addmm)
    impl("addmm.out")(addmm_out)
    impl("addmm_")(addmm_)
    impl("baddbmm")(baddbmm)
    impl("baddbmm.out")(baddbmm_out)
    impl("baddbmm_")(baddbmm_)
    impl("addbmm")(addbmm)
    impl("addbmm.out")(addbmm_out)
    impl("addbmm_")(addbmm_)
    impl("addmv")(addmv)
    impl("addmv.out")(addmv_out)
    impl("addmv_")(addmv_)
    impl("mv")(mv)
    impl("mv.out")(mv_out)
    impl("dot")(dot)
    impl("vdot")(vdot)
    impl("dot.out")(dot_out)
    impl("vdot.out")(vdot_out)
    impl("addr")(addr)
    impl("addr.out")(addr_out)
    impl("addr_")(addr_)

    # qr.py
    impl("geqrf")(geqrf)
    impl("geqrf.a")(geqrf_out)
    impl("linalg_qr")(linalg_qr)
    impl("linalg_qr.out")(linalg_qr_out)
    impl("linalg_householder_product")(householder_product)
    impl("linalg_householder_product.out")(householder_product_out)
    impl("ormqr")(ormqr)
    impl("ormqr.out")(ormqr_out)

    # solve.py
    impl("linalg_lu_solve")(linalg_lu_solve)
    impl("linalg_lu_solve.out")(linalg_lu_solve_out)
    impl("_linalg_solve_ex")(linalg_solve_ex)
    impl("_linalg_solve_ex.result")(linalg_solve_ex_out)
    impl("linalg_inv_ex")(linalg_inv_ex)
    impl("linalg_inv_ex.inverse")(linalg_inv_ex_out)
    impl("_linalg_det")(linalg_det)
    impl("_linalg_det.result")(linalg_det_out)
    impl("_linalg_slogdet")(linalg_slogdet)
    impl("_linalg_slogdet.sign")(linalg_slogdet_out)
    impl("_cholesky_solve_helper")(cholesky_solve_helper)
    impl("cholesky_inverse")(cholesky_inverse)
    impl("cholesky_inverse.out")(cholesky_inverse_out)
