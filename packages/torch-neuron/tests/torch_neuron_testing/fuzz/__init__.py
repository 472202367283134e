"""The project's differential fuzzer: ops on ``neuron`` against the CPU on hypothesis-drawn cases, float64
as the arbiter when the two disagree.

- :mod:`.values`, :mod:`.spec`, :mod:`.strategies`: what a case is (tensors as rebuildable specs: shape,
  dtype, layout, fill, edge values) and how hypothesis draws them (sizes 0, 1, primes, > 128 partitions,
  large free dims; dense, transposed, sliced, expanded, overlapping, channels-last views; every dtype;
  +-inf, NaN, +-0, denormals, +-1e20, dtype extremes).
- :mod:`.op` and the family tables (:mod:`.pointwise`, :mod:`.reductions`, :mod:`.nn`, :mod:`.matmul`,
  :mod:`.indexing`, :mod:`.movement`, :mod:`.sorting`, :mod:`.conv`, :mod:`.casts`, :mod:`.opdb`),
  collected in :mod:`.families`.
- :mod:`.compare`: one case on both devices and its verdict; :mod:`.runner`: hypothesis searches and what
  they found; :mod:`.known`: known defects the fast profile skips; :mod:`.report`: the Markdown summary.

Entry points: ``tests/test_fuzz.py`` (the fast profile, in ``nox -s test``) and ``bench/fuzz.py``
(``nox -s fuzz -- --seed N --budget SECONDS``, writes docs/fuzz.md).
"""
