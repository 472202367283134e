"""Dependency analysis: which earlier instructions each instruction must wait for (the semaphores a compiler
would insert), from the memory its accesses read and write.

``dependencies`` turns an encoded program's accesses (:mod:`.encode`) into per-access geometry (partition and
byte ranges on chip, row segments in HBM) and walks them in program order with a Numba-compiled pass; the
result is a predecessor CSR and, per instruction, the latest instruction of its own engine whose output it reads
(that instruction's pipeline must drain first: the dependent-issue rule of :mod:`.costs`).
"""

from __future__ import annotations

import numba
import numpy as np

from neuron_hal.profiles import Profile

from . import costs
from .plan import N_COMPUTE

# Dependency tracking indexes memory by blocks (SBUF: bytes per partition; PSUM: banks; HBM: bytes of a
# tensor). Records inside a block keep exact byte and partition ranges, so block sizes only trade memory
# and speed; they are model choices, not hardware numbers.
DEP_SBUF_BLOCK_BYTES = 512  # INFERRED: SBUF bytes per partition per tracked block (PSUM uses whole banks)
DEP_HBM_BLOCK_BYTES = 512  # INFERRED: HBM bytes per tracked block (DMA-friendly alignment)
# Implementation limits (bound the prepare-time memory; not hardware numbers).
HBM_DEP_BLOCKS_MAX = 1 << 22  # HBM blocks tracked individually; larger programs get coarser HBM blocks
HBM_ACCESS_BLOCKS_MAX = 1 << 15  # an HBM access touching more blocks is tracked per tensor (conservative)
RECORDS_PER_STREAM_MAX = 4  # disjoint access records a stream keeps per block before merging them


class Geometry:
    """Per-access geometry of one program (CSR by instruction), built once and walked per stream numbering."""

    def __init__(self, program, profile: Profile, enc):
        self.g = _geometry(program, profile, enc.aps, enc.acc_i, enc.acc_row, enc.acc_w, enc.n)
        self.n = enc.n

    @property
    def hbm_block_bytes(self) -> int:
        return int(self.g["hbm_blk"])

    def dependencies(self, streams: np.ndarray, n_streams: int):
        """(pred_ptr, preds, producer) with instructions numbered onto ``streams`` (an instruction waits only
        for other streams' instructions and its own DMA queue: a compute stream runs in program order)."""
        g = self.g
        return _dependencies(
            self.n, streams.astype(np.int64), n_streams, g["ptr"], g["write"], g["kind"], g["lo"], g["hi"], g["plo"],
            g["phi"], g["ref"], g["h_tensor"], g["h_base"], g["h_len"], g["h_size"], g["h_stride"], g["t_base"],
            g["t_nblk"], g["hbm_blk"], g["sb_blk"], g["sb_nblk"], g["ps_blk"], g["ps_nblk"], g["quad"], g["n_quad"],
            g["scratch"])


def successors(n, pred_ptr, preds):
    """Successor CSR and dependency counts (succ_ptr, succ_idx, pred_count) from the predecessor CSR."""
    return _successors(n, pred_ptr, preds)


def _geometry(program, profile: Profile, aps, acc_i, acc_row, acc_w, n) -> dict:
    """Per-access geometry for the dependency pass (CSR by instruction).

    On chip: the partition range and the per-partition byte range. HBM: segments (rows x outer free dims),
    each a byte range [base + offsets, ... + len) of the tensor.
    """
    # Drop empty accesses, order by instruction (stable: fields in class order).
    nonempty = (aps.partitions[acc_row] > 0) & (aps.n[acc_row] > 0) if acc_row.size else np.zeros(0, bool)
    acc_i, acc_row, acc_w = acc_i[nonempty], acc_row[nonempty], acc_w[nonempty]
    order = np.argsort(acc_i, kind="stable")
    acc_i, acc_row, acc_w = acc_i[order], acc_row[order], acc_w[order]
    ptr = np.concatenate(([0], np.cumsum(np.bincount(acc_i, minlength=n)))).astype(np.int64)

    space = aps.space[acc_row]
    isz = aps.itemsize[acc_row]
    fid = aps.fid[acc_row]
    fr = aps.free
    n_quad, quad = 1, profile.sbuf_partitions  # blocks span all partitions (records keep partition ranges)
    sb_nblk = -(-profile.sbuf_partition_bytes // DEP_SBUF_BLOCK_BYTES)
    ps_nblk = profile.psum_banks
    psum = space == costs.PSUM
    limit = np.where(psum, profile.psum_partition_bytes, profile.sbuf_partition_bytes)
    lo = np.minimum(np.maximum(aps.offset[acc_row] + fr.lo[fid] * isz, 0), limit - 1)
    hi = np.minimum(np.maximum(aps.offset[acc_row] + fr.hi[fid] * isz, lo + 1), limit)
    plo = np.minimum(np.maximum(aps.start[acc_row], 0), profile.sbuf_partitions - 1)
    phi = np.minimum(np.maximum(aps.start[acc_row] + aps.partitions[acc_row], plo + 1), profile.sbuf_partitions)
    unit = np.where(psum, profile.psum_bank_bytes, DEP_SBUF_BLOCK_BYTES)
    ub = (hi - 1) // unit - lo // unit + 1
    kind = space.astype(np.int8)  # 0 SBUF, 1 PSUM, 2 HBM (fine), 3 HBM (coarse, per tensor), 4 no-op

    # HBM: segments = rows x outer free dims; each segment is a byte range [base, base + len).
    n_tensors = len(program.args)
    tensor_bytes = np.array([a.nbytes for a in program.args], np.int64)
    hbm_blk = DEP_HBM_BLOCK_BYTES
    while int(np.sum(-(-tensor_bytes // hbm_blk))) > HBM_DEP_BLOCKS_MAX:
        hbm_blk *= 2
    t_nblk = np.maximum(-(-tensor_bytes // hbm_blk), 1)
    t_base = np.concatenate(([0], np.cumsum(t_nblk))).astype(np.int64)
    h = np.flatnonzero(space == costs.HBM)
    hr = acc_row[h]
    hf = fid[h]
    hisz = isz[h]
    in_n, in_st = fr.inner_size[hf], fr.inner_stride[hf]
    ilo = np.where(in_n > 1, np.minimum(0, (in_n - 1) * in_st), 0) * hisz
    ihi = (np.where(in_n > 1, np.maximum(0, (in_n - 1) * in_st), 0) + 1) * hisz
    h_len = ihi - ilo
    h_base = aps.offset[hr] + ilo
    h_size = np.ones((h.size, 4), np.int64)
    h_stride = np.zeros((h.size, 4), np.int64)
    h_size[:, 0] = aps.partitions[hr]
    h_stride[:, 0] = aps.pstride[hr] * hisz
    h_size[:, 1:] = fr.outer_size[hf]
    h_stride[:, 1:] = fr.outer_stride[hf] * hisz[:, None]
    # Rows that tile the tensor densely (no outer free dims, row stride = row length) form one segment.
    dense = (np.all(h_size[:, 1:] == 1, axis=1)) & (h_stride[:, 0] == h_len)
    h_len = np.where(dense, h_len * h_size[:, 0], h_len)
    h_size[dense, 0] = 1
    h_tensor = np.minimum(np.maximum(aps.tensor[hr], 0), max(n_tensors - 1, 0))
    h_ub = np.prod(h_size, axis=1) * (h_len // hbm_blk + 2)
    coarse = h_ub > HBM_ACCESS_BLOCKS_MAX
    kind[h[coarse]] = 3
    # Reads of a tensor the program never writes cannot depend on anything: skip them.
    written = np.zeros(max(n_tensors, 1), bool)
    written[h_tensor[acc_w[h] == 1]] = True
    kind[h[(acc_w[h] == 0) & ~written[h_tensor]]] = 4
    ub[h] = np.where(coarse, 0, h_ub)
    ref = np.zeros(acc_row.size, np.int64)
    ref[h] = np.where(coarse, h_tensor, np.arange(h.size))
    return dict(ptr=ptr, write=acc_w.astype(np.int8), kind=kind, lo=lo.astype(np.int64), hi=hi.astype(np.int64),
                plo=plo.astype(np.int64), phi=phi.astype(np.int64), ref=ref, h_tensor=h_tensor.astype(np.int64),
                h_base=h_base.astype(np.int64), h_len=h_len.astype(np.int64), h_size=h_size, h_stride=h_stride,
                t_base=t_base, t_nblk=t_nblk.astype(np.int64), hbm_blk=hbm_blk, sb_blk=DEP_SBUF_BLOCK_BYTES,
                sb_nblk=sb_nblk, ps_blk=profile.psum_bank_bytes, ps_nblk=ps_nblk, quad=quad,
                n_quad=n_quad, scratch=int(ub.max()) if ub.size else 1)


# ---- dependency graph (Numba) -----------------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def _add_pred(j, i, s, stream, mark, preds, npred):
    """Record j as a dependency of i (once; same compute stream is implied by program order).
    The caller guarantees room in preds."""
    if j < 0 or j == i or mark[j] == i:
        return npred
    mark[j] = i
    if s < N_COMPUTE and stream[j] == s:
        return npred
    preds[npred] = j
    return npred + 1


@numba.njit(cache=True, inline="always", error_model="numpy")
def _grow(arr, used, need):
    if used + need <= arr.shape[0]:
        return arr
    grown = np.empty(max(2 * arr.shape[0], used + need), arr.dtype)
    grown[:used] = arr[:used]
    return grown


@numba.njit(cache=True, inline="always", error_model="numpy")
def _access_blocks(a, kind, lo, hi, plo, phi, ref, h_tensor, h_base, h_len, h_size, h_stride, t_base, t_nblk,
                   hbm_blk, sb_blk, sb_nblk, ps_blk, ps_nblk, quad, n_quad, blk, blo, bhi, bplo, bphi):
    """Fill (blk, blo, bhi, bplo, bphi) with the blocks access a touches and, in each, the byte range
    (relative to the block) and partition range it covers; returns how many (a block may repeat)."""
    cnt = 0
    k = kind[a]
    if k <= 1:
        if k == 0:
            base, qstride, unit = 0, sb_nblk, sb_blk
        else:
            base, qstride, unit = n_quad * sb_nblk, ps_nblk, ps_blk
        p0, p1, x0, x1 = plo[a], phi[a], lo[a], hi[a]
        for q in range(p0 // quad, (p1 - 1) // quad + 1):
            for b in range(x0 // unit, (x1 - 1) // unit + 1):
                blk[cnt] = base + q * qstride + b
                blo[cnt] = max(x0 - b * unit, 0)
                bhi[cnt] = min(x1 - b * unit, unit)
                bplo[cnt] = max(p0, q * quad)
                bphi[cnt] = min(p1, (q + 1) * quad)
                cnt += 1
        return cnt
    r = ref[a]
    t = h_tensor[r]
    tb = n_quad * (sb_nblk + ps_nblk) + t_base[t]
    tensor_end = t_nblk[t] * hbm_blk
    ln = h_len[r]
    s0, s1, s2, s3 = h_size[r, 0], h_size[r, 1], h_size[r, 2], h_size[r, 3]
    d0, d1, d2, d3 = h_stride[r, 0], h_stride[r, 1], h_stride[r, 2], h_stride[r, 3]
    for i0 in range(s0):
        for i1 in range(s1):
            for i2 in range(s2):
                for i3 in range(s3):
                    x0 = min(max(h_base[r] + i0 * d0 + i1 * d1 + i2 * d2 + i3 * d3, 0), tensor_end - 1)
                    x1 = min(max(x0 + ln, x0 + 1), tensor_end)
                    for b in range(x0 // hbm_blk, (x1 - 1) // hbm_blk + 1):
                        r0 = max(x0 - b * hbm_blk, 0)
                        r1 = min(x1 - b * hbm_blk, hbm_blk)
                        if cnt > 0 and blk[cnt - 1] == tb + b and blo[cnt - 1] <= r1 and r0 <= bhi[cnt - 1]:
                            blo[cnt - 1] = min(blo[cnt - 1], r0)  # touches the previous segment: one range
                            bhi[cnt - 1] = max(bhi[cnt - 1], r1)
                            continue
                        blk[cnt] = tb + b
                        blo[cnt] = r0
                        bhi[cnt] = r1
                        bplo[cnt] = 0
                        bphi[cnt] = 1
                        cnt += 1
    return cnt


@numba.njit(cache=True, error_model="numpy")
def _visit_blocks(i, s, phase, cnt, blk, blo, bhi, bplo, bphi, head, recs, n_rec, free_rec, stream, mark,
                  preds, npred):
    """Apply one access (its cnt block ranges) of instruction i to the block records (see _dependencies).
    The caller guarantees room for cnt new records and for every record's instruction as a predecessor.
    Returns (npred, n_rec, free_rec, producer): the latest instruction of i's own compute stream whose write this
    read overlaps (-1 if none)."""
    producer = -1
    for c in range(cnt):
        b = blk[c]
        x0, x1, p0, p1 = blo[c], bhi[c], bplo[c], bphi[c]
        mine = -1  # a record of this stream and kind that the new range covers: reused
        n_mine = 0  # other records of this stream and kind in this block
        merge_into = -1
        before = -1
        rec = head[b]
        while rec >= 0:
            nxt = recs[rec, 7]
            overlap = recs[rec, 3] < x1 and x0 < recs[rec, 4] and recs[rec, 5] < p1 and p0 < recs[rec, 6]
            if overlap and (phase == 1 or recs[rec, 2] == 1):
                j = recs[rec, 0]
                if j != i and mark[j] != i:  # _add_pred inlined by hand: a call costs more than the work
                    mark[j] = i
                    if s >= N_COMPUTE or stream[j] != s:
                        preds[npred] = j
                        npred += 1
                if phase == 0 and s < N_COMPUTE and stream[j] == s and j != i and j > producer:
                    producer = j
            covered = x0 <= recs[rec, 3] and recs[rec, 4] <= x1 and p0 <= recs[rec, 5] and recs[rec, 6] <= p1
            same = recs[rec, 1] == s and recs[rec, 2] == phase
            if covered and same and mine < 0:
                mine = rec
                before = rec
            elif covered and (same or (phase == 1 and recs[rec, 0] != i)):
                # superseded: later accesses that overlap it overlap this one too
                if before < 0:
                    head[b] = nxt
                else:
                    recs[before, 7] = nxt
                recs[rec, 7] = free_rec
                free_rec = rec
            else:
                if same:
                    n_mine += 1
                    if merge_into < 0 or recs[rec, 0] == i:
                        merge_into = rec  # the newest record (lists are newest first), or this instruction's
                before = rec
            rec = nxt
        if mine < 0 and n_mine >= RECORDS_PER_STREAM_MAX:
            mine = merge_into  # too many: merge into the hull (conservative)
            j = recs[mine, 0]
            if j != i and mark[j] != i:  # the record will stand for i: i must not overtake j (a DMA queue
                mark[j] = i  # orders completions, not starts)
                if s >= N_COMPUTE or stream[j] != s:
                    preds[npred] = j
                    npred += 1
        if mine >= 0:
            recs[mine, 0] = i
            recs[mine, 3] = min(recs[mine, 3], x0)
            recs[mine, 4] = max(recs[mine, 4], x1)
            recs[mine, 5] = min(recs[mine, 5], p0)
            recs[mine, 6] = max(recs[mine, 6], p1)
        else:
            if free_rec >= 0:
                rec = free_rec
                free_rec = recs[rec, 7]
            else:
                rec = n_rec
                n_rec += 1
            recs[rec, 0] = i
            recs[rec, 1] = s
            recs[rec, 2] = phase
            recs[rec, 3] = x0
            recs[rec, 4] = x1
            recs[rec, 5] = p0
            recs[rec, 6] = p1
            recs[rec, 7] = head[b]
            head[b] = rec
    return npred, n_rec, free_rec, producer


@numba.njit(cache=True, error_model="numpy")
def _dependencies(n, stream, n_streams, ptr, write, kind, lo, hi, plo, phi, ref, h_tensor, h_base, h_len, h_size,
                  h_stride, t_base, t_nblk, hbm_blk, sb_blk, sb_nblk, ps_blk, ps_nblk, quad, n_quad, scratch):
    """Dependencies of every instruction, in program order, from the memory its accesses read and write.

    Memory is cut into blocks; each block keeps a list of access records (instruction, stream, read or
    write, byte range in the block, partition range). A read depends on the overlapping write records, a
    write on all overlapping records; records a write covers are dropped (later accesses reach them through
    the write), and so are a stream's records that its new access of the same kind covers. Beyond
    RECORDS_PER_STREAM_MAX records per stream and kind in a block, the new access merges into one of them
    (instruction := the new one, range := the hull): a stream completes in order, so its latest
    instruction stands for the earlier ones (conservative).
    HBM accesses too large to enumerate are tracked per tensor ("coarse"), ordered against every access to
    that tensor. Returns (pred_ptr, preds, producer): producer[i] is the latest instruction of i's own compute
    stream whose output i reads (-1 if none; its pipeline must drain before i issues, see :mod:`.costs`).
    """
    n_tensors = t_nblk.shape[0]
    n_blocks = n_quad * (sb_nblk + ps_nblk) + t_base[n_tensors]
    head = np.full(n_blocks, -1, np.int32)  # first record of each block
    # Records, one row each (one cache line): instruction, stream, is-write, byte lo, byte hi, partition lo,
    # partition hi, next record of the block.
    cap = 1024
    recs = np.empty((cap, 8), np.int32)
    n_rec = 0
    free_rec = -1
    g_count = max(n_tensors, 1)
    coarse_writer = np.full(g_count, -1, np.int32)
    fine_writer = np.full((g_count, n_streams), -1, np.int32)  # latest fine writer of a tensor per stream
    fine_reader = np.full((g_count, n_streams), -1, np.int32)
    coarse_reader = np.full((g_count, n_streams), -1, np.int32)
    mark = np.full(max(n, 1), -1, np.int64)
    pred_ptr = np.zeros(n + 1, np.int64)
    preds = np.empty(max(16, 2 * n), np.int32)
    npred = 0
    producer = np.full(n, -1, np.int32)
    m = max(scratch, 1)
    blk = np.empty(m, np.int64)
    blo = np.empty(m, np.int64)
    bhi = np.empty(m, np.int64)
    bplo = np.empty(m, np.int64)
    bphi = np.empty(m, np.int64)
    for i in range(n):
        s = stream[i]
        for phase in range(2):  # reads first, then writes
            for a in range(ptr[i], ptr[i + 1]):
                if write[a] != phase:
                    continue
                k = kind[a]
                if k == 4:
                    continue
                preds = _grow(preds, npred, 4 * n_streams + 1)  # the per-tensor (coarse) slots
                if k == 3:
                    g = ref[a]
                    if coarse_writer[g] >= 0:
                        npred = _add_pred(coarse_writer[g], i, s, stream, mark, preds, npred)
                    for s2 in range(n_streams):
                        if fine_writer[g, s2] >= 0:
                            npred = _add_pred(fine_writer[g, s2], i, s, stream, mark, preds, npred)
                        if phase == 1:
                            if fine_reader[g, s2] >= 0:
                                npred = _add_pred(fine_reader[g, s2], i, s, stream, mark, preds, npred)
                            if coarse_reader[g, s2] >= 0:
                                npred = _add_pred(coarse_reader[g, s2], i, s, stream, mark, preds, npred)
                    if phase == 0:
                        coarse_reader[g, s] = i
                    else:
                        coarse_writer[g] = i
                        fine_writer[g, :] = -1
                        fine_reader[g, :] = -1
                        coarse_reader[g, :] = -1
                    continue
                if k == 2:
                    g = h_tensor[ref[a]]
                    if coarse_writer[g] >= 0:
                        npred = _add_pred(coarse_writer[g], i, s, stream, mark, preds, npred)
                    if phase == 0:
                        fine_reader[g, s] = i
                    else:
                        for s2 in range(n_streams):
                            if coarse_reader[g, s2] >= 0:
                                npred = _add_pred(coarse_reader[g, s2], i, s, stream, mark, preds, npred)
                        fine_writer[g, s] = i
                cnt = _access_blocks(a, kind, lo, hi, plo, phi, ref, h_tensor, h_base, h_len, h_size, h_stride,
                                     t_base, t_nblk, hbm_blk, sb_blk, sb_nblk, ps_blk, ps_nblk, quad, n_quad,
                                     blk, blo, bhi, bplo, bphi)
                # room for every record of every block (distinct earlier instructions: at most i)
                preds = _grow(preds, npred, min(cnt * 2 * RECORDS_PER_STREAM_MAX * n_streams, i + 1))
                if n_rec + cnt > cap:
                    cap = 2 * (n_rec + cnt)
                    grown = np.empty((cap, 8), np.int32)
                    grown[:n_rec] = recs[:n_rec]
                    recs = grown
                npred, n_rec, free_rec, prod = _visit_blocks(i, s, phase, cnt, blk, blo, bhi, bplo, bphi,
                                                             head, recs, n_rec, free_rec, stream, mark, preds, npred)
                if prod > producer[i]:
                    producer[i] = prod
        pred_ptr[i + 1] = npred
    return pred_ptr, preds[:npred].copy(), producer


@numba.njit(cache=True, error_model="numpy")
def _successors(n, pred_ptr, preds):
    """Successor CSR and dependency counts from the predecessor CSR."""
    succ_ptr = np.zeros(n + 1, np.int64)
    for k in range(preds.shape[0]):
        succ_ptr[preds[k] + 1] += 1
    for i in range(n):
        succ_ptr[i + 1] += succ_ptr[i]
    fill = succ_ptr[:n].copy()
    succ_idx = np.empty(preds.shape[0], np.int32)
    pred_count = np.empty(n, np.int32)
    for i in range(n):
        pred_count[i] = pred_ptr[i + 1] - pred_ptr[i]
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            p = preds[k]
            succ_idx[fill[p]] = i
            fill[p] += 1
    return succ_ptr, succ_idx, pred_count
