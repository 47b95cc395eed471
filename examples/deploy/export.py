"""Export a converted DLRM for a C++ server: an AOTInductor package (and a traced TorchScript
model) whose embedding lookups are perfkernels' native ops.

    python examples/deploy/export.py OUT_DIR [--max-rows 1000] [--batch 1] [--stock] [--optimize]
                                     [--script]

Writes into OUT_DIR:

* ``converted.pt2``: the AOTInductor package of the model after ``perfkernels.torch.convert``
  (``stock.pt2`` with ``--stock``: the same model unconverted, for comparison;
  ``optimized.pt2`` with ``--optimize``: the model after ``perfkernels.torch.optimize``, its 26
  lookups and the dot interaction one native fused op);
* ``converted.ts`` (with ``--script``): the model traced with ``torch.jit.trace``;
* ``train_step.ts``, ``train_inputs.bin``, ``train_expected.bin`` (with ``--script``): a
  TorchScript training step of the first table, its fused optimizer step run from C++
  (``TrainStep``: the backward of one batch's bags fused with row-wise Adagrad, the native op
  ``perfkernels::embedding_bag_backward_update`` the modules' fused optimizers run), its inputs
  (table, optimizer state, indices, offsets, gradient of the bags) and the table after the step
  in Python;
* ``inputs.bin``: one batch of inputs in the order the package takes them (dense, the 26 index
  tensors, the 26 offset tensors), and ``expected.bin``: the Python model's output for it, in
  the small raw format ``deploy.cpp`` reads (per tensor: int32 dtype code (0 float32, 1 int64),
  int32 ndim, int64 sizes, then the data);
* ``native_library.txt``: the path of perfkernels' native library (what the C++ program
  dlopens; ``perfkernels.torch.native_library_path()``).

Then build and run the C++ program (docs/deployment.md):  ``examples/deploy/run.sh OUT_DIR``.
The model is the Criteo Kaggle DLRM of examples/dlrm.py (26 tables, D = 64, bottom MLP
13-512-256-64, dot interaction, top MLP 512-256-1) with each table capped at ``--max-rows`` rows.
"""
from __future__ import annotations

import argparse
import copy
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dlrm import DLRM, MODEL_CLASSES, make_batches  # noqa: E402

import perfkernels.torch as pt  # noqa: E402

_CODES = {torch.float32: 0, torch.int64: 1}


def write_tensors(path: str, tensors: list[torch.Tensor]) -> None:
    """The raw format deploy.cpp reads (see the module docstring)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(tensors)))
        for t in tensors:
            t = t.detach().contiguous()
            f.write(struct.pack("<ii", _CODES[t.dtype], t.dim()))
            f.write(struct.pack(f"<{t.dim()}q", *t.shape))
            f.write(t.numpy().tobytes())


class Flat(torch.nn.Module):
    """The DLRM with flat tensor arguments (dense, 26 index tensors, 26 offset tensors), the
    calling convention of an AOTInductor package."""

    def __init__(self, model: DLRM) -> None:
        super().__init__()
        self.model = model
        self.n = len(model.tables)

    def forward(self, dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
        return self.model(dense, list(sparse[:self.n]), list(sparse[self.n:]))


class TrainStep(torch.nn.Module):
    """One fused optimizer step of a table: the backward of the bags (indices, offsets) whose
    output's gradient is ``grad``, fused with row-wise Adagrad (lr 0.05), ``weight`` and its
    ``state`` updated in place; returns the table."""

    def forward(self, weight: torch.Tensor, state: torch.Tensor, indices: torch.Tensor,
                offsets: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        torch.ops.perfkernels.embedding_bag_backward_update(
            weight, indices, offsets, None, "sum", False, None, grad, "rowwise_adagrad", state,
            None, 0.05, 1e-8, 0.0, None, 0.9, 0.999, 0.0, False, False, 0)
        return weight


def write_train_step(out_dir: str, model: DLRM, inputs: list) -> None:
    """train_step.ts and its inputs and expected table, for the first table and batch."""
    n = len(model.tables)
    weight = model.tables[0].weight.detach().clone()
    indices, offsets = inputs[1], inputs[1 + n]
    grad = torch.randn(offsets.numel(), weight.shape[1], generator=torch.Generator().manual_seed(2))
    step_inputs = [weight, torch.zeros(weight.shape[0]), indices, offsets, grad]
    write_tensors(os.path.join(out_dir, "train_inputs.bin"), step_inputs)
    step = torch.jit.script(TrainStep())
    after = step(*[t.clone() for t in step_inputs])
    write_tensors(os.path.join(out_dir, "train_expected.bin"), [after])
    step.save(os.path.join(out_dir, "train_step.ts"))


def build(max_rows: int, seed: int = 0) -> DLRM:
    torch.manual_seed(seed)
    return DLRM.of_class(MODEL_CLASSES["criteo"], max_rows, sparse=False).eval()


def example_inputs(model: DLRM, batch: int, bag_size: int = 1, seed: int = 1) -> list:
    rows = [t.num_embeddings for t in model.tables]
    dense, indices, offsets, _ = make_batches(rows, batch, bag_size, 1, seed)[0]
    return [dense] + [i.long() for i in indices] + [o.long() for o in offsets]


def export_package(module: torch.nn.Module, inputs: list, path: str) -> str:
    """torch.export, then AOTInductor's package (one CPU .so inside a .pt2 archive)."""
    with torch.no_grad():
        program = torch.export.export(module, tuple(inputs))
        return torch._inductor.aoti_compile_and_package(program, package_path=path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--max-rows", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--stock", action="store_true", help="also package the unconverted model")
    ap.add_argument("--optimize", action="store_true",
                    help="also package the optimize()d model (lookups fused with the interaction)")
    ap.add_argument("--script", action="store_true", help="also write a traced TorchScript model")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    stock = build(args.max_rows)
    converted = pt.convert(copy.deepcopy(stock))
    inputs = example_inputs(stock, args.batch)
    with torch.no_grad():
        expected = Flat(converted)(*inputs)
    write_tensors(os.path.join(args.out_dir, "inputs.bin"), inputs)
    write_tensors(os.path.join(args.out_dir, "expected.bin"), [expected])
    with open(os.path.join(args.out_dir, "native_library.txt"), "w") as f:
        f.write(pt.native_library_path() + "\n")
    export_package(Flat(converted), inputs, os.path.join(args.out_dir, "converted.pt2"))
    if args.stock:
        export_package(Flat(stock), inputs, os.path.join(args.out_dir, "stock.pt2"))
    if args.optimize:
        n = len(stock.tables)
        optimized = pt.optimize(copy.deepcopy(stock),
                                example_inputs=(inputs[0], inputs[1:1 + n], inputs[1 + n:]))
        with torch.no_grad():
            got = Flat(optimized)(*inputs)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        export_package(Flat(optimized), inputs, os.path.join(args.out_dir, "optimized.pt2"))
    if args.script:
        with torch.no_grad():
            traced = torch.jit.trace(Flat(converted), tuple(inputs), check_trace=False)
        traced.save(os.path.join(args.out_dir, "converted.ts"))
        write_train_step(args.out_dir, stock, inputs)
    print(f"wrote {args.out_dir}")


if __name__ == "__main__":
    main()
