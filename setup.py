"""Build perfkernels: one Cython extension per kernel family, and one per shared module.

The families are the rows of ``perfkernels/_registry.py``: ``perfkernels/families/<family>/_<family>.pyx``
becomes ``perfkernels.families.<family>._<family>``, linked with the C files of its folder.  From a
kernel family's public header ``include/perfkernels/<family>.h`` (where each kernel's signature is
written once) ``perfkernels/_codegen.py`` generates its per-level declarations, per-level files and
dispatch table into ``build/csrc/<family>/``, and its Cython declarations ``_c_<family>.pxd``; from
the annotated signatures of its wrapper's public functions, its type stub ``_<family>.pyi``.  A shared module ``perfkernels/_<name>.pyx`` is linked with
the C files of ``perfkernels/csrc/<name>/``; ``perfkernels/torch/_tensor_bags.pyx`` (the torch
layer's fast path, which reads tensors through DLPack's C API at run time) needs no torch headers
to build.  The ISA levels come from that registry:
a file named after a level (``avx2.c``, ``avx512.c``) gets that level's flags, and only when the
target is the level's architecture; every other file (the dispatch tables, the scalar level, the Cython modules) is built
with the baseline flags of the target, so a wheel built here runs on any x86-64 (and the scalar C
builds on aarch64).  Never -march=native.
"""
import concurrent.futures
import hashlib
import os
import platform
import runpy
import shutil
import subprocess
import sysconfig
import threading
from glob import glob
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# by file path: importing the package would need the extensions this script builds
REGISTRY = runpy.run_path(os.path.join(HERE, "perfkernels", "_registry.py"))
CODEGEN = runpy.run_path(os.path.join(HERE, "perfkernels", "_codegen.py"))
LEVELS = REGISTRY["LEVELS"]
BASE_FLAGS = list(REGISTRY["BASE_FLAGS"])
SANITIZERS = ("address", "undefined")
GENERATED = os.path.join("build", "csrc")   # the generated C of the families (see the docstring)


def sanitizer_flags(value: str) -> tuple[list[str], list[str]]:
    """Compile and link flags for ``PERFKERNELS_SANITIZE`` (e.g. ``address,undefined``).

    Applied to every C source and Cython module.  UBSan stops at the first report
    (``-fno-sanitize-recover``) so that any report fails the test that triggered it; frame pointers
    and -O1 keep ASan's stack traces readable, and ``-g1`` (line tables only, after Python's own
    ``-g``) gives them file and line while compiling the large kernel files in about 60% of the
    time full debug information takes.  ``-fno-wrapv`` undoes the ``-fwrapv`` that Python's
    own CFLAGS put on every extension: with it, signed overflow is defined (it wraps) and UBSan
    does not report it, so an overflow in a Cython module (a size computation) would go unseen.  An
    empty value gives no flags; an unknown name is an error, so a typo never silently builds an
    uninstrumented extension.
    """
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SANITIZERS]
    if unknown:
        raise SystemExit(f"PERFKERNELS_SANITIZE={value!r}: unknown sanitizer(s) {', '.join(unknown)}; "
                         f"valid: {', '.join(SANITIZERS)}")
    if not names:
        return [], []
    sanitize = "-fsanitize=" + ",".join(names)
    compile_flags = [sanitize, "-fno-omit-frame-pointer", "-O1", "-g1"]
    if "undefined" in names:
        compile_flags += ["-fno-sanitize-recover=undefined", "-fno-wrapv"]
    return compile_flags, [sanitize]


SANITIZE_COMPILE, SANITIZE_LINK = sanitizer_flags(os.environ.get("PERFKERNELS_SANITIZE", ""))


try:
    # PERFKERNELS_LEVELS: a development build of some levels only (the registry's omitted_levels)
    LEVEL_MACROS = [(f"PK_OMIT_{name}", "1")
                    for name in REGISTRY["omitted_levels"](os.environ.get("PERFKERNELS_LEVELS", ""))]
except ValueError as error:
    raise SystemExit(str(error)) from None


def _target_arch() -> str:
    """The architecture the extensions are built for: the platform sysconfig names (which is
    ``_PYTHON_HOST_PLATFORM`` when cross-compiling, e.g. ``linux-aarch64`` on an x86-64 host, as
    .ci/arm_python does), else this machine's."""
    plat = sysconfig.get_platform().lower()
    for arch, names in (("x86_64", ("x86_64", "amd64")), ("aarch64", ("aarch64", "arm64"))):
        if any(name in plat for name in names):
            return arch
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def isa_flags(source: str, arch: str) -> list:
    """The flags of the ISA level a C source belongs to (by its file name), or []."""
    stem = os.path.splitext(os.path.basename(source))[0]
    for level in LEVELS:
        if stem == level.name and level.arch == arch:
            return list(level.flags)
    return []


def _is_kernel_source(src: str) -> bool:
    """Our C files (a family's level files, its scalar.c, csrc/), not Cython's generated C."""
    return src.endswith(".c") and not os.path.basename(src).startswith("_")


class BuildExt(build_ext):
    """Adds ISA flags per source file, the way NumPy's dispatchable sources are built, and compiles
    each distinct translation unit once.

    The native torch library and the Cython extensions compile the same kernel files (the bag
    kernels are most of the build's time): a C file whose preprocessed text and compiler command
    are those of one already compiled in this build is not compiled again, its object is copied.
    And every source of every out-of-date extension is compiled first in one pool of ``-j`` threads,
    the ISA level files (the long ones) first, rather than one extension per thread (distutils compiles an extension's
    sources one after another, which left the native library's long list on one core).

    The match holds across builds too: beside each kernel object it writes its unit key
    (``<object>.unit``), and a later build that needs a unit an earlier one left in build/ copies
    that object.  Each ``pip install .`` builds in a new isolated environment whose NumPy .pxd files
    are newer than the Cython output, so Cython regenerates it and every Cython extension (with its
    copies of the kernels) is rebuilt, while the native library is not: without the keys, the
    README's second install (``.[test]`` after ``.[bench]``) compiled every kernel file again,
    which took 9 of its 10 minutes on 2 cores."""

    UNIT_SUFFIX = ".unit"

    def _earlier_units(self) -> dict:
        """Unit key -> object, for the kernel objects earlier builds left in build_temp."""
        found = {}
        for record in glob(os.path.join(self.build_temp, "**", "*.o" + self.UNIT_SUFFIX),
                           recursive=True):
            obj = record[:-len(self.UNIT_SUFFIX)]
            try:
                with open(record) as f:
                    key = f.read().strip()
                # the record is written after its object, so an object newer than it was rewritten
                if key and os.path.getmtime(obj) <= os.path.getmtime(record):
                    found.setdefault(key, obj)
            except OSError:
                continue
        return found

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None or self.parallel is True:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self):
        compiler = self.compiler
        if compiler.compiler_type == "unix":
            original = compiler._compile
            arch = _target_arch()
            lock = threading.Lock()
            units: dict[str, concurrent.futures.Future] = {}   # unit key -> its first object
            done: set = set()                                   # (object, command) built this run
            earlier = self._earlier_units()                     # unit key -> an earlier build's object

            def unit_key(src, cc_args, flags, pp_opts):
                """The preprocessed text and the rest of the command, or None (cannot tell)."""
                command = list(compiler.compiler_so) + list(cc_args) + flags
                run = subprocess.run(command + ["-E", "-P", src], capture_output=True)
                if run.returncode:
                    return None
                digest = hashlib.sha256(run.stdout)
                # include paths and macros act through the preprocessed text
                digest.update("\0".join(a for a in command if a not in pp_opts).encode())
                return digest.hexdigest()

            def _compile(obj, src, ext, cc_args, extra_postargs, pp_opts):
                flags = list(extra_postargs)
                if _is_kernel_source(src):
                    # the native library's C++ hides its symbols; the kernels' C is compiled as for
                    # the Cython extensions, so that each file is compiled once for both
                    flags = ([f for f in flags if f not in ("-std=c11", "-fvisibility=hidden")]
                             + ["-std=c11"] + isa_flags(src, arch))
                elif src.endswith(".cpp"):  # the native torch library (C++17)
                    flags = [f for f in flags if f != "-std=c11"] + ["-std=c++17"]
                else:  # Cython output: C, but keep warnings from generated code quiet
                    flags = [f for f in flags if f not in ("-std=c11", "-Wall")]
                job = (obj, src, tuple(cc_args), tuple(flags))
                with lock:
                    if job in done:          # compiled by the pool below
                        return None
                key = unit_key(src, cc_args, flags, pp_opts) if _is_kernel_source(src) else None
                if key is None:
                    original(obj, src, ext, cc_args, flags, pp_opts)
                else:
                    with lock:
                        first = units.get(key)
                        mine = first is None
                        if mine:
                            first = units[key] = concurrent.futures.Future()
                    record = obj + self.UNIT_SUFFIX
                    if os.path.exists(record):
                        os.remove(record)
                    if mine:
                        try:
                            old = earlier.get(key)
                            if old is not None and os.path.exists(old):
                                if old != obj:
                                    os.makedirs(os.path.dirname(obj) or ".", exist_ok=True)
                                    shutil.copyfile(old, obj)
                            else:
                                original(obj, src, ext, cc_args, flags, pp_opts)
                        except BaseException as error:
                            first.set_exception(error)
                            raise
                        first.set_result(obj)
                    elif first.result() != obj:
                        shutil.copyfile(first.result(), obj)
                    with open(record, "w") as f:
                        f.write(key + "\n")
                with lock:
                    done.add(job)
                return None

            compiler._compile = _compile
            self._compile_all_sources()
        super().build_extensions()

    def _compile_all_sources(self):
        """Compiles the sources of every extension that is out of date, as build_extension would
        (same arguments), in a pool of ``self.parallel`` threads, level files first."""
        try:
            from setuptools.modified import newer_group          # setuptools >= 69
        except ImportError:
            from setuptools._distutils.dep_util import newer_group

        jobs = []
        for ext in self.extensions:
            sources = sorted(ext.sources)
            if not (self.force or newer_group(sources + ext.depends, self.get_ext_fullpath(ext.name),
                                              "newer")):
                continue
            macros = ext.define_macros[:] + [(undef,) for undef in ext.undef_macros]
            for src in sources:
                jobs.append((ext, macros, src))
        levels = {f"{level.name}.c" for level in LEVELS if level.flags}
        jobs.sort(key=lambda job: os.path.basename(job[2]) not in levels)   # the long ones first
        with concurrent.futures.ThreadPoolExecutor(max(1, int(self.parallel))) as pool:
            for future in [pool.submit(self.compiler.compile, [src], output_dir=self.build_temp,
                                       macros=macros, include_dirs=ext.include_dirs,
                                       debug=self.debug, extra_postargs=ext.extra_compile_args or [],
                                       depends=ext.depends) for ext, macros, src in jobs]:
                future.result()


def _write_isa_list():
    """The rows of PK_ISA_LIST in include/perfkernels/isa_list.h, from the registry's levels."""
    path = os.path.join(HERE, "include", "perfkernels", "isa_list.h")
    with open(path) as f:
        text = f.read()
    new = CODEGEN["isa_list_source"](text, LEVELS)
    if new != text:
        with open(path, "w") as f:
            f.write(new)


def _write_wrapper(wrapper: str, src: str) -> None:
    """A one-line C file under build/ that includes src by a path relative to itself: a clone
    built elsewhere preprocesses to the same text, line markers included, so a compiler cache
    (ccache, as CI uses) hits across clones."""
    target = os.path.relpath(os.path.join(HERE, src), os.path.dirname(os.path.join(HERE, wrapper)))
    CODEGEN["write_if_changed"](Path(HERE, wrapper), f'#include "{target}"\n')


def _native_library(include, macros, headers) -> Extension:
    """``perfkernels/torch/_native*.so``: the torch ops, registered from C++ on PyTorch's stable
    C ABI (perfkernels/torch/native/).  Built always, with no torch headers and no torch library
    at link time (the few stable-ABI functions it calls are declared in stable_abi.h and looked up
    in the process's libtorch_cpu when it is loaded), and without libpython, so one build serves
    every torch from 2.10 on and a C++ program can load it.  It compiles the bag kernels of the
    embedding, quantized, interaction, sequence, LSTM and training families itself, every level, through small wrapper files under
    build/csrc/native/; BuildExt compiles each of those once for both this library and the Cython
    extensions (same flags: the kernels' C symbols keep default visibility here, the C++ hides its
    own)."""
    out = os.path.join(GENERATED, "native")
    sources = []
    for family in ("embedding", "quantized", "interaction", "sequence", "lstm", "training"):
        folder = os.path.join(HERE, REGISTRY["FAMILIES_DIR"], family)
        for src in CODEGEN["family_sources"](folder, family, os.path.join(HERE, GENERATED),
                                             REGISTRY["NAMES"]):
            # named as the original (a level's file keeps the level's name and flags)
            wrapper = os.path.join(out, family, os.path.basename(str(src)))
            _write_wrapper(wrapper, str(src))
            sources.append(wrapper)
    wrapper = os.path.join(out, "cpu", "features.c")
    _write_wrapper(wrapper, os.path.join(HERE, "perfkernels", "csrc", "cpu", "features.c"))
    sources.append(wrapper)
    rows = [f'static const char *const pk_level_requires_{i}[] = {{'
            + "".join(f'"{r}", ' for r in level.requires) + "NULL};" for i, level in enumerate(LEVELS)]
    rows.append("static const char *const *const pk_level_requires[] = {"
                + ", ".join(f"pk_level_requires_{i}" for i in range(len(LEVELS))) + "};")
    CODEGEN["write_if_changed"](Path(HERE, out, "levels.h"),
                                "/* Generated by setup.py from perfkernels/_registry.py. */\n"
                                "#include <stddef.h>\n" + "\n".join(rows) + "\n")
    native = "perfkernels/torch/native"
    sources += sorted(glob(f"{native}/*.cpp"))
    return Extension("perfkernels.torch._native", sources=sources, include_dirs=include + [native],
                     define_macros=macros, language="c++",
                     extra_compile_args=BASE_FLAGS + ["-fvisibility=hidden"] + SANITIZE_COMPILE,
                     extra_link_args=SANITIZE_LINK + ["-ldl"],
                     depends=headers + sorted(glob(f"{native}/*.h")))


def _extensions():
    _write_isa_list()
    macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")] + LEVEL_MACROS
    families = REGISTRY["FAMILIES_DIR"]
    # "simd/avx2.h" from csrc/, "embedding/body.h" from the families' folder, the generated
    # "embedding/levels.h" from build/csrc/
    include = ["include", "perfkernels/csrc", families, GENERATED, np.get_include()]
    headers = sorted(glob("include/perfkernels/*.h") + glob("perfkernels/csrc/**/*.h", recursive=True)
                     + glob(f"{families}/*/*.h") + glob("perfkernels/*.pxd") + glob(f"{families}/*/*.pxd"))
    shared = [os.path.basename(pyx)[1:-4] for pyx in sorted(glob("perfkernels/_*.pyx"))]
    # (module, its .pyx, the folder of its C files)
    modules = [(f"perfkernels._{m}", f"perfkernels/_{m}.pyx", f"perfkernels/csrc/{m}") for m in shared]
    modules += [(f"perfkernels.families.{f.name}._{f.name}", f"{families}/{f.name}/_{f.name}.pyx",
                 f"{families}/{f.name}") for f in REGISTRY["FAMILIES"]]
    for family in REGISTRY["FAMILIES"]:
        if family.header:
            CODEGEN["write_pxd"](HERE, family.name)
        CODEGEN["write_stub"](HERE, family.name, family.functions)
    # the torch layer's C fast path (it imports torch at run time; no torch headers needed)
    modules.append(("perfkernels.torch._tensor_bags", "perfkernels/torch/_tensor_bags.pyx",
                    "perfkernels/torch"))
    exts = [_native_library(include, macros, headers)]
    for name, pyx, folder in modules:
        family = name.rsplit("._", 1)[1]
        sources = [pyx] + [os.path.relpath(p, HERE) for p in
                           CODEGEN["family_sources"](os.path.join(HERE, folder), family,
                                                     os.path.join(HERE, GENERATED), REGISTRY["NAMES"])]
        exts.append(Extension(name, sources=sources, include_dirs=include,
                              define_macros=macros, extra_compile_args=BASE_FLAGS + SANITIZE_COMPILE,
                              extra_link_args=SANITIZE_LINK, depends=headers))
    return exts


setup(
    ext_modules=cythonize(
        _extensions(),
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
            "embedsignature": True,
            # annotations are type hints for readers and the generated .pyi stubs, not C types
            "annotation_typing": False,
        },
    ),
    cmdclass={"build_ext": BuildExt},
)
