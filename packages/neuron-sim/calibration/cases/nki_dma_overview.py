"""The NKI DMA overview's two profiled loads on one trn2 NeuronCore (NeuronCore-v3): A[4, 4096] and A[128, 128]
bfloat16 (32 KiB each) from HBM to SBUF.

Published in aws-neuron-sdk ``nki/get-started/about/nki-dma-overview.rst`` (first at db1586c3, Dec 2025, as
``nki/about/nki-dma-overview.rst``; text and images unchanged through HEAD 81ce03ae): Example 1 (lines 90-155, the
1,416 ns at line 153, profile image ``nki/img/overviews/nki-dma-intro-3.png``) and Example 2 (lines 157-235,
images ``nki-dma-intro-5.png`` to ``-7.png``). The source kernels load the tensor with ``nisa.dma_copy``, apply
one ``nisa.activation(exp)`` and store it back; the published figures are durations of parts of the load's DMA
only, read from Neuron Explorer tooltips, so each case's kernel is that one ``dma_copy`` HBM -> SBUF and nothing
else. The figures are windows inside a profile: they exclude the trigger, descriptor generation and queueing
before the first data moves and the completion semaphore's return, and the kernel's launch (see each note).
"""

from __future__ import annotations

import neuron_kernels as nk
from neuron_kernels import isa as nisa
from neuron_kernels import language as nl

from ..suite import Case, Measurement
from ._common import spec

DOC = "aws-neuron-sdk 81ce03ae (first db1586c3) nki/get-started/about/nki-dma-overview.rst"


@nk.kernel
def dma_load(in_tensor):
    """The examples' load: the whole [P, F] tensor into an SBUF tile of the same shape, row p in partition p,
    one explicit dma_copy (queue: the project's default; the profiles show it on qSyncIO0 for example 1 and
    qGpSimdDynamic, software DGE on GpSimd, for example 2)."""
    sbuf_tensor = nl.ndarray(in_tensor.shape, in_tensor.dtype)
    nisa.dma_copy(sbuf_tensor, in_tensor[:, :])


_DIFFERS = ("only the load of the source kernel (its exp and store are not part of the figure); the figure is a "
            "window inside the load's DMA, while the simulator's device time of this one-DMA kernel runs from "
            "the DMA's issue (DGE issue, fixed latency) to its completion: compare the matching interval")

CASES = [
    Case("nki-dma-overview", "load_4x4096_bf16", dma_load, (spec((4, 4096), "bfloat16"),),
         Measurement(
             1.416, "profile", "trn2",
             f"{DOC}, Example 1 profile (lines 145-155; image nki/img/overviews/nki-dma-intro-3.png, tooltip)",
             "2025-12", includes_launch=False,
             note="1,416 ns = the duration of the single data-carrying DMA descriptor bar on one engine "
                  "(DMA-E64, queue qSyncIO0, tooltip 'Time: 23,283ns - 24,699ns', read/write/transfer size "
                  "32.0039 KiB = the 32 KiB of 4 rows x 8 KiB plus its 4 B semaphore write): the data phase of "
                  "that one engine, from the start of its descriptor (first read) to the end of its last write "
                  "(the semaphore write included), i.e. 32 KiB at 23.1 B/ns on one engine. Not in it: the "
                  "trigger on Sync (~22.3-22.5 us, read off the image), the ~0.8 us from trigger to the "
                  "descriptor's start, the other 15 engines' 4 B semaphore-only writes (~23.05-23.27 us, "
                  "before E64's bar), the completion seen by the core (Pending DMA count drops at ~24.7 us). "
                  "Trigger to completion is ~2.4 us (read-off)"),
         differs=_DIFFERS, metric="dma_data", scheduled=False),
    Case("nki-dma-overview", "load_128x128_bf16", dma_load, (spec((128, 128), "bfloat16"),),
         Measurement(
             0.468, "profile", "trn2",
             f"{DOC}, Example 2 profile (lines 219-235; images nki/img/overviews/nki-dma-intro-5.png "
             "(per engine) and nki-dma-intro-7.png (queue), tooltips)", "2025-12", includes_launch=False,
             note="468 ns = the whole transfer on queue qGpSimdDynamic (tooltip 'Time: 34,039 ns - 34,507 ns', "
                  "read/write size 32 KiB): from the first of the 16 engines' 2 KiB descriptors starting "
                  "(DMA-E68, ~34,039 ns) to the last engine's completion with its 4 B semaphore write "
                  "(DMA-E77, ~34,507 ns); the engines start staggered over ~0.4 us and each moves 8 rows x "
                  "256 B = 2 KiB, e.g. DMA-E64's data descriptor 97 ns (34,051-34,148 ns, 2 KiB: 21 B/ns; "
                  "the per-engine bars read ~80-160 ns). Not in it: the DMA_DIRECT2D trigger on GpSimd "
                  "(33,300-33,308 ns) and the ~0.74 us from it to the first descriptor (descriptor generation "
                  "and queueing); the Pending DMA count runs ~33.3 to ~34.5 us. 32 KiB / 468 ns = 70 B/ns for "
                  "the queue; a per-engine comparison would use the 97 ns descriptor of 2 KiB"),
         differs=_DIFFERS + "; the profiled load was issued by software DGE on GpSimd (qGpSimdDynamic), the "
                            "simulator charges its hardware-DGE issue cost",
         metric="dma_data", scheduled=False),
]
