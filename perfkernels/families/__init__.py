"""The kernel families, one folder each (the rows of ``perfkernels/_registry.py``).

A family's folder holds all that belongs to it: its C kernels (``body.h`` over the SIMD layer, a
plain-C ``scalar.c`` where the portable level is written by hand), its Cython wrapper
``_<family>.pyx`` with the C declarations ``_c_<family>.pxd`` and the type stub ``_<family>.pyi``,
its CUDA kernels (``*.cu``) and their host code ``_cuda.py``, and its part of the benchmark suite
(``bench.py``).  The public functions are re-exported as ``perfkernels.<function>``.
"""
