"""Ad-hoc: perfkernels.lstm_unit(_backward) against a torch.compile'd version of the same pointwise
function, single thread.  Not an asv benchmark (nothing runs on import; torch.compile needs a C++
compiler and takes a while); run it by hand:

    PYTHONPATH=. python benchmarks/lstm_torch_compile.py [N D]     (from the repository root)
"""


def main(argv=None):
    import sys

    import numpy as np
    import torch

    import perfkernels as pk
    from perfkernels.benchsuite import median_time
    from perfkernels.families.lstm.bench import (make_inputs, numpy_backward, numpy_forward,
                                             torch_backward, torch_forward)

    argv = sys.argv[1:] if argv is None else argv
    n, d = (int(argv[0]), int(argv[1])) if len(argv) >= 2 else (256, 1024)
    torch.set_num_threads(1)
    x = make_inputs(n, d)
    t = {k: torch.from_numpy(v) for k, v in x.items()}

    def fwd(c_prev, gates):
        return torch_forward(torch, c_prev, gates)

    def bwd(c_prev, gates, c, dh, dc):
        return torch_backward(torch, c_prev, gates, c, dh, dc)

    rows = {
        "forward": {
            "perfkernels": lambda: pk.lstm_unit(x["h_prev"], x["c_prev"], x["gates"]),
            "numpy": lambda: numpy_forward(x["c_prev"], x["gates"]),
            "torch eager": lambda: fwd(t["c_prev"], t["gates"]),
        },
        "backward": {
            "perfkernels": lambda: pk.lstm_unit_backward(x["c_prev"], x["gates"], x["c"], x["dh"], x["dc"]),
            "numpy": lambda: numpy_backward(x["c_prev"], x["gates"], x["c"], x["dh"], x["dc"]),
            "torch eager": lambda: bwd(t["c_prev"], t["gates"], t["c"], t["dh"], t["dc"]),
        },
    }
    try:
        cf, cb = torch.compile(fwd), torch.compile(bwd)
        with torch.no_grad():
            h_c, c_c = cf(t["c_prev"], t["gates"])
            cb(t["c_prev"], t["gates"], t["c"], t["dh"], t["dc"])
        h, _ = pk.lstm_unit(x["h_prev"], x["c_prev"], x["gates"])
        print(f"torch.compile forward max |h - ours| = {np.abs(h_c.numpy() - h).max():.2e}")
        rows["forward"]["torch.compile"] = lambda: cf(t["c_prev"], t["gates"])
        rows["backward"]["torch.compile"] = lambda: cb(t["c_prev"], t["gates"], t["c"], t["dh"], t["dc"])
    except Exception as exc:  # noqa: BLE001  (no compiler, unsupported platform, ...)
        print(f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")

    print(f"N={n} D={d}, one thread, ISA {pk.active_isa()}, median ms (ratio = their time / ours)")
    for what, fns in rows.items():
        times = {name: median_time(fn, repeat=9) for name, fn in fns.items()}
        ours = times["perfkernels"]
        print(f"  {what:<9}" + "  ".join(f"{name} {tm * 1e3:.3f} ms (x{tm / ours:.2f})"
                                           for name, tm in times.items()))


if __name__ == "__main__":
    main()
