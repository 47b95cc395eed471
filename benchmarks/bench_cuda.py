"""asv benchmarks of perfkernels.cuda (GPU).  Without a usable GPU each benchmark has a single
placeholder parameter whose ``setup`` raises NotImplementedError with the reason, so asv reports
one skip per benchmark instead of one per case.

Each benchmark times ``REPS`` calls and one device synchronisation (``time_*``, wall clock), and
reports device throughput measured with CUDA events (``track_*_gbps``), the fraction of the
device-to-device copy bandwidth (``track_*_copy_fraction``) and, where PyTorch CUDA has the op,
the speed ratio to it (``track_*_vs_torch``), so the published history shows all three.
The cases are those of ``perfkernels.benchsuite.cuda`` (fbgemm_gpu-like per-table shape, the large
10M-row shape, conversions of 16 Mi elements, quantized lookups, the LSTM unit).
"""


def _gpu_work():
    try:
        from perfkernels.benchsuite import cuda as suite
    except ImportError as exc:
        raise NotImplementedError(f"perfkernels.benchsuite.cuda unavailable: {exc}")
    items = suite.work(quick=False)
    if not items:
        from perfkernels import cuda
        raise NotImplementedError(f"no GPU: {cuda.unavailable_reason()}")
    return suite, {w.name: w for w in items}


_CACHE = {}


def _names():
    # Parameter names must be known without a GPU: build them from the suite's shapes.
    from perfkernels.benchsuite import cuda as suite
    from perfkernels._variants import CONVERSIONS, LSTM_SHAPES
    names = [f"{c.name} 16Mi" for c in CONVERSIONS]
    for shape, rows, d, b, l in suite.BAG_SHAPES:
        for t in ("float32", "float16", "float32 zipf"):
            names.append(f"embedding_bag {t} {shape} ({rows}x{d}, B {b}, L {l})")
        for bits in (8, 4):
            names.append(f"embedding_bag_quantized {bits}-bit {shape} ({rows}x{d}, B {b}, L {l})")
    names += [f"lstm_unit N {n} D {d}" for n, d in LSTM_SHAPES.values()]
    return names


def _gpu_missing() -> str:
    """Why there is no usable GPU here ("" when there is one); checked once, at import."""
    try:
        from perfkernels import cuda
    except ImportError as exc:
        return f"perfkernels.cuda unavailable: {exc}"
    return "" if cuda.is_available() else f"no GPU: {cuda.unavailable_reason()}"


GPU_MISSING = _gpu_missing()
NO_GPU = "(no GPU)"


class GpuKernels:
    params = [[NO_GPU] if GPU_MISSING else _names()]
    param_names = ["case"]
    timeout = 600

    def setup(self, *args):
        case = args[-1]
        if GPU_MISSING:
            raise NotImplementedError(GPU_MISSING)
        if "suite" not in _CACHE:
            _CACHE["suite"], _CACHE["work"] = _gpu_work()
            import cupy
            _CACHE["copy"] = _CACHE["suite"].copy_bandwidth_gpu(cupy)
        if case not in _CACHE["work"]:
            raise NotImplementedError(f"{case} is not in this suite")
        import cupy
        self.cp = cupy
        self.suite = _CACHE["suite"]
        self.work = _CACHE["work"][case]

    def time_ours(self, *args):
        for _ in range(self.suite.REPS):
            self.work.ours()
        self.cp.cuda.get_current_stream().synchronize()

    def track_gbps(self, *args):
        return self.work.nbytes / self.suite.event_time(self.cp, self.work.ours) / 1e9
    track_gbps.unit = "GB/s"

    def track_copy_fraction(self, *args):
        return self.track_gbps() / _CACHE["copy"]
    track_copy_fraction.unit = "fraction of copy bandwidth"

    def track_vs_torch(self, *args):
        if self.work.torch is None:
            raise NotImplementedError("PyTorch CUDA has no such op here")
        ours = self.suite.event_time(self.cp, self.work.ours)
        return self.suite.event_time(self.cp, self.work.torch) / ours
    track_vs_torch.unit = "x PyTorch CUDA"


class GpuCopyBandwidth:
    def setup(self):
        if GPU_MISSING:
            raise NotImplementedError(GPU_MISSING)
        import cupy
        self.cp = cupy
        from perfkernels.benchsuite import cuda as suite
        self.suite = suite

    def track_copy_gbps(self):
        return self.suite.copy_bandwidth_gpu(self.cp)
    track_copy_gbps.unit = "GB/s"
