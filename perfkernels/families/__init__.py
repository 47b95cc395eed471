"""The kernel families, one folder each (the rows of ``perfkernels/_registry.py``).

A family's folder (a namespace package, no ``__init__.py``) holds all that belongs to it: its C
kernels (``body.h`` over the SIMD layer, a plain-C ``scalar.c`` where the portable level is written
by hand), its Cython wrapper ``_<family>.pyx``, its float64 NumPy reference ``reference.py``, its
CUDA kernels (``*.cu``) and their host code ``_cuda.py``, and its part of the benchmark suite
(``bench.py``).  The build generates the rest from the family's public header and its wrapper
(``perfkernels/_codegen.py``): the C declarations ``_c_<family>.pxd`` and the type stub
``_<family>.pyi``.  The public functions are re-exported as ``perfkernels.<function>``.
"""
