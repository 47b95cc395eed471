"""The native fused optimizer step, perfkernels::embedding_bag_backward_update, called as a graph
or a C++ program calls it: through torch.ops, straight to the kernel of perfkernels' native
library.  Every optimizer, table dtype and ISA level against the float64 references of
perfkernels.reference (written from the formulas); awkward dims; the bag options; threads;
errors that write nothing; the profiler; torch.compile; and that it runs with no perfkernels
Python loaded.  The modules' fused optimizers step through this op (tests/test_torch_fused*.py
check them against torch.optim)."""
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perfkernels.torch as pt  # noqa: E402
from perfkernels import reference  # noqa: E402

from conftest import AWKWARD_DIMS, run_with_torch_only  # noqa: E402
from sparse_training import bags_of  # noqa: E402

op = torch.ops.perfkernels.embedding_bag_backward_update.default

SCHEMA = ("perfkernels::embedding_bag_backward_update(Tensor(a!) weight, Tensor indices, "
          "Tensor? offsets, Tensor? per_sample_weights, str bag_mode, bool include_last_offset, "
          "SymInt? padding_idx, Tensor grad_output, str optimizer, Tensor(b!)? state, "
          "Tensor(c!)? state2, float lr, float eps, float weight_decay, int? step, float beta1, "
          "float beta2, float momentum, bool nesterov, bool stochastic_rounding, int seed) -> ()")

#: name -> (optimizer, options)
CASES = {
    "sgd": ("sgd", {"weight_decay": 0.05}),
    "adagrad": ("adagrad", {"weight_decay": 0.05}),
    "rowwise_adagrad": ("rowwise_adagrad", {}),
    "adam": ("adam", {"weight_decay": 0.1}),
    "adamw": ("adamw", {"weight_decay": 0.1}),
    "rowwise_adam": ("rowwise_adam", {"weight_decay": 0.1}),
    "momentum": ("sgd", {"momentum": 0.9}),
    "nesterov": ("sgd", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.05}),
}
ADAM = ("adam", "adamw", "rowwise_adam")
#: half an ulp, relative, and half the subnormal spacing of each table dtype
HALF_ULP = {torch.float32: 0.0, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
TINY = {torch.float32: 2.0 ** -150, torch.float16: 2.0 ** -25, torch.bfloat16: 2.0 ** -134}


def new_state(optimizer, opts, rows, D, rng):
    """(state, state2) as float32 tensors, random where the optimizer keeps state."""
    def make(shape, lo, hi):
        return torch.from_numpy(rng.uniform(lo, hi, shape).astype(np.float32))
    if optimizer == "sgd":
        return (make((rows, D), -0.5, 0.5) if opts.get("momentum") else None), None
    if optimizer in ADAM:
        return (make((rows, D), -0.5, 0.5),
                make((rows,) if optimizer == "rowwise_adam" else (rows, D), 0.05, 1.0))
    return make((rows, D) if optimizer == "adagrad" else (rows,), 0.05, 1.0), None


def call(weight, indices, offsets, grad, optimizer, state, state2, *, lr=0.05, eps=1e-8,
         weight_decay=0.0, step=None, betas=(0.9, 0.999), momentum=0.0, nesterov=False,
         per_sample_weights=None, mode="sum", include_last_offset=False, padding_idx=None,
         stochastic_rounding=False, seed=0):
    op(weight, indices, offsets, per_sample_weights, mode, include_last_offset, padding_idx, grad,
       optimizer, state, state2, lr, eps, weight_decay, step, betas[0], betas[1], momentum,
       nesterov, stochastic_rounding, seed)


def _numpy(t):
    if t is None:
        return None
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(reference.BFLOAT16)
    return t.numpy()


def expected(weight, indices, offsets, grad, optimizer, opts, state, state2, *, lr, eps, step,
             **bags):
    """The float64 reference of one step: (weight, [states], touched)."""
    np_bags = {k: (_numpy(v) if isinstance(v, torch.Tensor) else v) for k, v in bags.items()}
    args = (_numpy(weight), _numpy(indices), _numpy(offsets))
    if optimizer in ADAM or opts.get("momentum"):
        st = _numpy(state) if optimizer == "sgd" else (_numpy(state), _numpy(state2))
        kw = dict(opts, step=step) if optimizer in ADAM else dict(opts)
        r = reference.embedding_bag_backward_adam(*args, grad_output=grad.numpy(),
                                                  optimizer=optimizer, state=st, lr=lr, eps=eps,
                                                  **kw, **np_bags)
        return r.weight, list(r.state), r.touched
    r = reference.embedding_bag_backward_update(*args, grad_output=grad.numpy(),
                                                optimizer=optimizer, state=_numpy(state), lr=lr,
                                                eps=eps, **opts, **np_bags)
    return r.weight, [] if r.state is None else [r.state], r.touched


def check(rng, case, dtype, D, rows=40, num_bags=12, max_len=9, index_dtype=torch.int64,
          rtol=2e-5, **bags):
    optimizer, opts = CASES[case]
    weight = torch.from_numpy(rng.standard_normal((rows, D)).astype(np.float32)).to(dtype)
    ix, off = bags_of(rng, rows, num_bags, max_len)
    off = off[:num_bags]      # no bags: no offsets
    indices = torch.from_numpy(ix).to(index_dtype)
    offsets = torch.from_numpy(off).to(index_dtype)
    grad = torch.from_numpy(rng.standard_normal((num_bags, D)).astype(np.float32))
    if bags.pop("weighted", False):
        bags["per_sample_weights"] = torch.from_numpy(
            rng.standard_normal(indices.numel()).astype(np.float32))
    state, state2 = new_state(optimizer, opts, rows, D, rng)
    step = 3 if optimizer in ADAM else None
    exp_w, exp_states, touched = expected(weight, indices, offsets, grad, optimizer, opts, state,
                                          state2, lr=0.05, eps=1e-8, step=step, **bags)
    w0 = weight.clone()
    olds = [s.clone() for s in (state, state2) if s is not None]
    call(weight, indices, offsets, grad, optimizer, state, state2, step=step, **opts, **bags)
    w0_64 = w0.double().numpy()
    tol = (rtol * (np.abs(w0_64) + np.abs(exp_w - w0_64) + 0.05)
           + HALF_ULP[dtype] * np.abs(exp_w) * 1.001 + TINY[dtype])
    err = np.abs(weight.double().numpy() - exp_w)
    assert np.all(err <= tol), f"weight: max error {err.max()}"
    news = [s for s in (state, state2) if s is not None]
    assert len(news) == len(exp_states)
    for got, want, old in zip(news, exp_states, olds):
        np.testing.assert_allclose(got.numpy(), want, rtol=rtol,
                                   atol=rtol * (float(old.abs().max()) + 1))
        assert torch.equal(got[torch.from_numpy(~touched)], old[torch.from_numpy(~touched)])
    assert torch.equal(weight[torch.from_numpy(~touched)], w0[torch.from_numpy(~touched)])


def test_schema_and_native_kernel():
    assert str(op._schema) == SCHEMA
    dump = torch._C._dispatch_dump("perfkernels::embedding_bag_backward_update")
    cpu = [line for line in dump.splitlines() if line.startswith("CPU:")]
    assert cpu and "native/ops.cpp" in cpu[0], dump
    assert "Autograd" not in dump, dump


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_reference_every_level(isa, rng, case, dtype):
    check(rng, case, dtype, 17)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("D", AWKWARD_DIMS)
def test_awkward_dims(rng, case, D):
    check(rng, case, torch.float32, D)


@pytest.mark.parametrize("case", ["sgd", "rowwise_adagrad", "adam", "rowwise_adam"])
@pytest.mark.parametrize("bags", ["mean", "weighted", "padding", "include_last", "int32",
                                  "no_bags"])
def test_bag_options(rng, case, bags):
    kw = {}
    if bags == "mean":
        kw["mode"] = "mean"
    if bags == "weighted":
        kw["weighted"] = True
    if bags == "padding":
        kw["padding_idx"] = 3
    if bags == "int32":
        kw["index_dtype"] = torch.int32
    if bags == "no_bags":
        kw["num_bags"] = 0
    if bags == "include_last":
        optimizer, opts = CASES[case]
        weight = torch.from_numpy(rng.standard_normal((20, 9)).astype(np.float32))
        ix, off = bags_of(rng, 20, 5, 4)
        last = torch.from_numpy(np.concatenate([off, [ix.size]]))
        grad = torch.from_numpy(rng.standard_normal((5, 9)).astype(np.float32))
        state, state2 = new_state(optimizer, opts, 20, 9, rng)
        s_a = None if state is None else state.clone()
        s_b = None if state2 is None else state2.clone()
        w_a = weight.clone()
        step = 2 if optimizer in ADAM else None
        call(weight, torch.from_numpy(ix), last, grad, optimizer, state, state2, step=step,
             include_last_offset=True, **opts)
        call(w_a, torch.from_numpy(ix), torch.from_numpy(off), grad, optimizer, s_a, s_b,
             step=step, **opts)
        assert torch.equal(weight, w_a)
        return
    check(rng, case, torch.float32, 17, **kw)


def test_column_slice_and_strided_gradient(rng):
    """A column slice of a wider table (rows farther apart than D) is updated in place; a
    strided gradient is read as it is."""
    wide = torch.from_numpy(rng.standard_normal((30, 40)).astype(np.float32))
    part = wide[:, 8:24]
    outside = wide.clone()
    ix, off = bags_of(rng, 30, 6, 5)
    grad = torch.from_numpy(rng.standard_normal((16, 6)).astype(np.float32)).t()
    h = torch.zeros(30)
    exp_w, exp_states, _ = expected(part.clone(), torch.from_numpy(ix), torch.from_numpy(off),
                                    grad.contiguous(), "rowwise_adagrad", {}, h.clone(), None,
                                    lr=0.05, eps=1e-8, step=None)
    call(part, torch.from_numpy(ix), torch.from_numpy(off), grad, "rowwise_adagrad", h, None)
    np.testing.assert_allclose(part.numpy(), exp_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h.numpy(), exp_states[0], rtol=1e-5, atol=1e-7)
    assert torch.equal(wide[:, :8], outside[:, :8]) and torch.equal(wide[:, 24:], outside[:, 24:])


@pytest.mark.parametrize("layout", ["slice_of_wider", "expanded_rows", "expanded", "transposed"])
def test_gradient_layouts(rng, layout):
    """The gradient as backward passes it: a column slice of a wider one (DLRM's concatenation;
    read in place), rows broadcast (stride 0, ``.sum()``'s backward), or any other layout."""
    rows, D, B = 30, 16, 6
    weight = torch.from_numpy(rng.standard_normal((rows, D)).astype(np.float32))
    ix, off = (torch.from_numpy(a) for a in bags_of(rng, rows, B, 5))
    dense = torch.from_numpy(rng.standard_normal((B, D)).astype(np.float32))
    grad = {"slice_of_wider": torch.cat([torch.ones(B, 3), dense, torch.ones(B, 5)], 1)[:, 3:3 + D],
            "expanded_rows": dense[:1].expand(B, D),
            "expanded": torch.tensor(0.5).expand(B, D),
            "transposed": dense.t().contiguous().t()}[layout]
    h, h_ref = torch.zeros(rows, D), torch.zeros(rows, D)
    w_ref = weight.clone()
    call(w_ref, ix, off, grad.contiguous(), "adagrad", h_ref, None)
    exp_w, exp_states, _ = expected(weight.clone(), ix, off, grad.contiguous(), "adagrad", {},
                                    h.clone(), None, lr=0.05, eps=1e-8, step=None)
    call(weight, ix, off, grad, "adagrad", h, None)
    assert torch.equal(weight, w_ref) and torch.equal(h, h_ref)
    np.testing.assert_allclose(weight.numpy(), exp_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["adagrad", "adam"])
def test_threads_bit_identical(rng, case):
    optimizer, opts = CASES[case]
    rows, D, B = 5000, 64, 4096
    weight = torch.from_numpy(rng.standard_normal((rows, D)).astype(np.float32))
    ix = torch.from_numpy(rng.zipf(1.2, B * 8) % rows)
    off = torch.arange(0, B * 8, 8)
    grad = torch.from_numpy(rng.standard_normal((B, D)).astype(np.float32))
    state, state2 = new_state(optimizer, opts, rows, D, rng)
    results = []
    old = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            w = weight.clone()
            s1, s2 = state.clone(), None if state2 is None else state2.clone()
            call(w, ix, off, grad, optimizer, s1, s2, step=1 if optimizer in ADAM else None,
                 **opts)
            results.append((w, s1, s2))
    finally:
        torch.set_num_threads(old)
    for w, s1, s2 in results[1:]:
        assert torch.equal(w, results[0][0]) and torch.equal(s1, results[0][1])
        assert s2 is None or torch.equal(s2, results[0][2])


def test_stochastic_rounding_is_seeded(rng):
    weight = torch.from_numpy(rng.standard_normal((20, 16)).astype(np.float32)).bfloat16()
    ix, off = torch.arange(20), torch.arange(0, 20, 2)
    grad = torch.from_numpy(rng.standard_normal((10, 16)).astype(np.float32)) * 1e-3
    outs = []
    for seed in (7, 7, 8):
        w = weight.clone()
        call(w, ix, off, grad, "sgd", None, None, lr=0.01, stochastic_rounding=True, seed=seed)
        outs.append(w)
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def _bad(change):
    w = torch.ones(6, 4)
    args = dict(weight=w, indices=torch.tensor([0, 5, 2]), offsets=torch.tensor([0, 1]),
                grad=torch.ones(2, 4), optimizer="adagrad", state=torch.zeros(6, 4), state2=None)
    kw = {}
    change(args, kw)
    return args, kw


ERRORS = [
    (lambda a, k: a.update(indices=torch.tensor([0, 6, 2])),
     "Index 1 of input takes value 6 which is not in the valid range [0, 6)"),
    (lambda a, k: a.update(indices=torch.tensor([0, -1, 2])), "Index 1 of input takes value -1"),
    (lambda a, k: a.update(optimizer="lamb"), "optimizer must be one of"),
    (lambda a, k: a.update(weight=torch.ones(6, 4, dtype=torch.float64)),
     "weight must be float32, float16 or bfloat16; got torch.float64"),
    (lambda a, k: a.update(weight=torch.ones(4, 6).t()), "weight must have unit stride along D"),
    (lambda a, k: a.update(weight=torch.ones(1, 4).expand(6, 4)), "rows that do not overlap"),
    (lambda a, k: a.update(state=torch.zeros(6)), "state must be 2-D"),
    (lambda a, k: a.update(state=torch.zeros(5, 4)), "state has shape [5, 4]"),
    (lambda a, k: a.update(state=torch.zeros(6, 4, dtype=torch.float16)),
     "state must be float32; got torch.float16"),
    (lambda a, k: a.update(state=None), "optimizer 'adagrad' needs state"),
    (lambda a, k: a.update(state=a["weight"]), "shares memory with weight"),
    (lambda a, k: a.update(state2=torch.zeros(6, 4)), "state2 must be None"),
    (lambda a, k: a.update(grad=torch.ones(3, 4)), "grad_output has shape [3, 4]; expected [2, 4]"),
    (lambda a, k: a.update(grad=torch.ones(2, 4, dtype=torch.float64)),
     "grad_output must be float32"),
    (lambda a, k: k.update(lr=-1.0), "lr = -1.000000 must be >= 0"),
    (lambda a, k: k.update(eps=float("nan")), "eps = nan must be finite"),
    (lambda a, k: k.update(weight_decay=1e39), "too large for float32"),
    (lambda a, k: k.update(step=3), "step is an option of the Adam family"),
    (lambda a, k: k.update(momentum=0.9), "momentum and nesterov are options of optimizer 'sgd'"),
    (lambda a, k: (a.update(optimizer="sgd", state=None), k.update(nesterov=True)),
     "nesterov=True needs momentum > 0"),
    (lambda a, k: (a.update(optimizer="adam", state2=torch.zeros(6, 4))),
     "optimizer 'adam' needs step"),
    (lambda a, k: (a.update(optimizer="adam", state2=torch.zeros(6, 4)), k.update(step=0)),
     "step = 0 must be >= 1"),
    (lambda a, k: (a.update(optimizer="adam", state2=torch.zeros(6, 4)),
                   k.update(step=1, betas=(0.9, 1.0))), "must each be in [0, 1)"),
    (lambda a, k: (a.update(optimizer="adam", state2=torch.zeros(6, 4)),
                   k.update(step=1, eps=0.0)), "eps = 0.000000 must be > 0"),
    (lambda a, k: (a.update(optimizer="adam", state2=a["state"]), k.update(step=1)),
     "state and state2 share memory"),
    (lambda a, k: (a.update(optimizer="rowwise_adam", state2=torch.zeros(6, 4)),
                   k.update(step=1)), "state2 (v) must be 1-D"),
    (lambda a, k: k.update(mode="max"), "mode must be 'sum' or 'mean'"),
    (lambda a, k: a.update(offsets=torch.tensor([1, 2])), "the first offset must be 0"),
]


@pytest.mark.parametrize("change, message", ERRORS, ids=[m[:30] for _, m in ERRORS])
def test_bad_input_raises_and_writes_nothing(change, message):
    args, kw = _bad(change)
    w0 = args["weight"].clone()
    states0 = [None if args[k] is None else args[k].clone() for k in ("state", "state2")]
    with pytest.raises(RuntimeError) as info:
        call(args["weight"], args["indices"], args["offsets"], args["grad"], args["optimizer"],
             args["state"], args["state2"], **kw)
    assert message in str(info.value)
    assert torch.equal(args["weight"], w0)
    for k, s0 in zip(("state", "state2"), states0):
        if s0 is not None and args[k] is not args["weight"]:
            assert torch.equal(args[k], s0)


def test_modules_step_through_the_op_and_the_profiler_sees_it(rng):
    """A fused module's backward runs the native op: it shows in torch.profiler by name, with
    its shapes, and its bad index is torch's IndexError."""
    bag = pt.EmbeddingBag(50, 8, mode="sum", fused_optimizer=("rowwise_adam", {"lr": 0.1}))
    ix, off = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2])
    with torch.profiler.profile(record_shapes=True) as prof:
        bag(ix, off).sum().backward()
    events = [e for e in prof.events() if e.name == "perfkernels::embedding_bag_backward_update"]
    assert len(events) == 1
    assert events[0].input_shapes[0] == [50, 8]
    assert int(bag.step) == 1


@pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None,
                    reason="torch.compile's inductor compiles C++: no $CXX or g++ on PATH")
def test_under_torch_compile(rng):
    """A compiled function that steps a table: the op in the graph (functionalised), the same
    update as the eager call."""
    weight = torch.from_numpy(rng.standard_normal((20, 8)).astype(np.float32))
    h = torch.zeros(20)
    ix, off = torch.tensor([1, 5, 5, 7]), torch.tensor([0, 2])
    grad = torch.from_numpy(rng.standard_normal((2, 8)).astype(np.float32))
    w_eager, h_eager = weight.clone(), h.clone()
    call(w_eager, ix, off, grad, "rowwise_adagrad", h_eager, None)

    def step(w, h, ix, off, g):
        call(w, ix, off, g, "rowwise_adagrad", h, None)
        return w.sum()

    compiled = torch.compile(step, backend="inductor", fullgraph=True)
    compiled(weight, h, ix, off, grad)
    assert torch.equal(weight, w_eager) and torch.equal(h, h_eager)


def test_runs_without_perfkernels_python():
    """Only torch and the library: one sgd step on a table."""
    run_with_torch_only(
        "w = torch.ones(4, 2)\n"
        "torch.ops.perfkernels.embedding_bag_backward_update(w, torch.tensor([0, 2, 2]), "
        "torch.tensor([0, 1]), None, 'sum', False, None, torch.tensor([[1., 2.], [3., 4.]]), "
        "'sgd', None, None, 0.5, 1e-8, 0., None, 0.9, 0.999, 0., False, False, 0)\n"
        "assert w.tolist() == [[0.5, 0.], [1., 1.], [-2., -3.], [1., 1.]], w",
        pt.native_library_path())


# --------------------------------------------------------------------------- many tables

many = torch.ops.perfkernels.embedding_bags_backward_update.default


def _tables(rng, case, dtype, dims=(1, 9, 17, 65), rows=30, num_bags=7):
    """One table per D in ``dims``, each with its own bags (some mean, some with a padding row,
    some int32) and state: a list of dicts."""
    optimizer, opts = CASES[case]
    out = []
    for f, D in enumerate(dims):
        weight = torch.from_numpy(rng.standard_normal((rows, D)).astype(np.float32)).to(dtype)
        ix, off = bags_of(rng, rows, num_bags, 6)
        index_dtype = torch.int32 if f % 2 else torch.int64
        state, state2 = new_state(optimizer, opts, rows, D, rng)
        out.append(dict(weight=weight, indices=torch.from_numpy(ix).to(index_dtype),
                        offsets=torch.from_numpy(off).to(index_dtype),
                        grad=torch.from_numpy(rng.standard_normal((num_bags, D))
                                              .astype(np.float32)),
                        mode="mean" if f % 3 == 1 else "sum",
                        padding_idx=2 if f % 2 == 0 else None, state=state, state2=state2,
                        step=(f + 2) if optimizer in ADAM else None))
    return out


def call_many(tables, case, *, lr=0.05, eps=1e-8, include_last_offset=False, seed0=0):
    optimizer, opts = CASES[case]
    betas = opts.get("betas", (0.9, 0.999))
    many([t["weight"] for t in tables], [t["indices"] for t in tables],
         [t["offsets"] for t in tables], [t["mode"] == "mean" for t in tables],
         include_last_offset, [-1 if t["padding_idx"] is None else t["padding_idx"]
                               for t in tables],
         [t["grad"] for t in tables], optimizer,
         [t["state"] for t in tables if t["state"] is not None],
         [t["state2"] for t in tables if t["state2"] is not None], lr, eps,
         opts.get("weight_decay", 0.0),
         [t["step"] for t in tables if t["step"] is not None], betas[0], betas[1],
         opts.get("momentum", 0.0), opts.get("nesterov", False), False,
         [seed0 + f for f in range(len(tables))])


def test_many_tables_schema_and_native_kernel():
    dump = torch._C._dispatch_dump("perfkernels::embedding_bags_backward_update")
    cpu = [line for line in dump.splitlines() if line.startswith("CPU:")]
    assert cpu and "native/ops.cpp" in cpu[0], dump
    assert "Tensor(a!)[] weights" in str(many._schema)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_many_tables_match_reference_every_level(isa, rng, case, dtype):
    """Each table of one many-table call against the float64 reference of its own step."""
    optimizer, opts = CASES[case]
    tables = _tables(rng, case, dtype)
    want = []
    for t in tables:
        bags = {"mode": t["mode"], "padding_idx": t["padding_idx"]}
        want.append(expected(t["weight"], t["indices"], t["offsets"], t["grad"], optimizer, opts,
                             t["state"], t["state2"], lr=0.05, eps=1e-8, step=t["step"],
                             **bags))
    before = [(t["weight"].clone(), [s.clone() for s in (t["state"], t["state2"])
                                     if s is not None]) for t in tables]
    call_many(tables, case)
    rtol = 2e-5
    for t, (exp_w, exp_states, touched), (w0, olds) in zip(tables, want, before):
        w0_64 = w0.double().numpy()
        tol = (rtol * (np.abs(w0_64) + np.abs(exp_w - w0_64) + 0.05)
               + HALF_ULP[dtype] * np.abs(exp_w) * 1.001 + TINY[dtype])
        err = np.abs(t["weight"].double().numpy() - exp_w)
        assert np.all(err <= tol), f"D={t['weight'].shape[1]}: max error {err.max()}"
        news = [s for s in (t["state"], t["state2"]) if s is not None]
        for got, exp, old in zip(news, exp_states, olds):
            np.testing.assert_allclose(got.numpy(), exp, rtol=rtol,
                                       atol=rtol * (float(old.abs().max()) + 1))
        untouched = torch.from_numpy(~touched)
        assert torch.equal(t["weight"][untouched], w0[untouched])


@pytest.mark.parametrize("case", ["sgd", "adagrad", "adam", "nesterov"])
def test_many_tables_a_table_twice_steps_twice(rng, case):
    """A table given twice is stepped twice, in order: what two one-table calls do."""
    t0, t1 = _tables(rng, case, torch.float32, dims=(9, 9))
    t1.update(weight=t0["weight"], state=t0["state"], state2=t0["state2"])
    if t0["step"] is not None:
        t1["step"] = t0["step"] + 1
    copies = [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
              for t in (t0, t1)]
    copies[1].update(weight=copies[0]["weight"], state=copies[0]["state"],
                     state2=copies[0]["state2"])
    optimizer, opts = CASES[case]
    for f, c in enumerate(copies):
        call(c["weight"], c["indices"], c["offsets"], c["grad"], optimizer, c["state"],
             c["state2"], step=c["step"], mode=c["mode"], padding_idx=c["padding_idx"],
             seed=f, **opts)
    call_many([t0, t1], case)
    assert torch.equal(t0["weight"], copies[0]["weight"])
    if t0["state"] is not None:
        assert torch.equal(t0["state"], copies[0]["state"])


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_many_tables_thread_counts_bit_identical(rng, threads):
    tables = _tables(rng, "rowwise_adagrad", torch.float32, dims=(16, 64), rows=500,
                     num_bags=300)
    results = []
    old = torch.get_num_threads()
    try:
        for n in (1, threads):
            torch.set_num_threads(n)
            copies = [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
                      for t in tables]
            call_many(copies, "rowwise_adagrad")
            results.append([c["weight"] for c in copies])
    finally:
        torch.set_num_threads(old)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def _many_bad_cases():
    def index(tables):
        tables[-1]["indices"][0] = 30          # one past the last row of the last table

    def negative(tables):
        tables[2]["indices"][1] = -1

    def grad_dtype(tables):
        tables[2]["grad"] = tables[2]["grad"].double()

    def grad_shape(tables):
        tables[1]["grad"] = tables[1]["grad"][:, :3]

    def state_shape(tables):
        tables[3]["state"] = tables[3]["state"][:5]

    def offsets(tables):
        tables[3]["offsets"][1] = 1000
    return [(index, "IndexError|Index 0 of input takes value 30"),
            (negative, "takes value -1"),
            (grad_dtype, r"grad_output\[2\] must be float32"),
            (grad_shape, r"grad_output\[1\] has shape"),
            (state_shape, r"state\[3\] has shape"),
            (offsets, "offsets")]


@pytest.mark.parametrize("change,message", _many_bad_cases(), ids=lambda x: getattr(x, "__name__", ""))
def test_many_tables_bad_input_writes_nothing(rng, change, message):
    """A bad argument of any table raises before the first table is written."""
    tables = _tables(rng, "adagrad", torch.float32)
    change(tables)
    before = [(t["weight"].clone(), t["state"].clone()) for t in tables]
    with pytest.raises(RuntimeError, match=message):
        call_many(tables, "adagrad")
    for t, (w, s) in zip(tables, before):
        assert torch.equal(t["weight"], w) and torch.equal(t["state"], s)


def test_many_tables_list_lengths_checked(rng):
    tables = _tables(rng, "sgd", torch.float32)
    with pytest.raises(RuntimeError, match=r"grad_outputs needs one entry per table \(4\); got 3"):
        many([t["weight"] for t in tables], [t["indices"] for t in tables],
             [t["offsets"] for t in tables], [0] * 4, False, [-1] * 4,
             [t["grad"] for t in tables[:3]], "sgd", [], [], 0.1, 1e-8, 0.0, [], 0.9, 0.999,
             0.0, False, False, [0] * 4)
