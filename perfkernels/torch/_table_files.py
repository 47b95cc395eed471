"""Modules over table files (:mod:`perfkernels.tables`): the table is a copy-on-write mapping of
the file, shared with every other process that maps it.

The mapping is private and copy-on-write (``MAP_PRIVATE``), not read-only: torch has no read-only
tensors, and a write into a read-only mapping would kill the process.  Lookups never write, so
the pages stay the page cache's, shared by every process on the host; a write (an optimizer step,
``load_state_dict``) copies the pages it touches into this process and never reaches the file.

``state_dict()`` of such a module holds the mapped tensor as any other table (saving it reads the
file's pages and writes them into the checkpoint); the module's ``table_file`` attribute names the
file, so a server saves the path rather than the table.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional, Union

import numpy as np
import torch
from torch import Tensor

from .. import tables as _tables


def mapped_tensor(path: Union[str, os.PathLike], *, fmt=None, rows: Optional[int] = None,
                  dim: Optional[int] = None) -> tuple[Tensor, _tables.TableInfo]:
    """The table file at ``path`` as a CPU tensor over a copy-on-write mapping of it (uint8
    packed rows, or float32/float16/bfloat16 ``[rows, D]``), and its header."""
    info = _tables.read_table_header(path)
    a = _tables.load_table(path, fmt=fmt, rows=rows, dim=dim, mode="c")
    if info.fmt == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16), info
    return torch.from_numpy(a), info


def quantized_bag_from_file(cls, path, *, bits: Optional[int] = None, dim: Optional[int] = None,
                            rows: Optional[int] = None, mode: str = "sum",
                            include_last_offset: bool = False,
                            padding_idx: Optional[int] = None):
    """``cls.from_packed`` over the mapped rows of a quantized table file."""
    path = os.fspath(path)
    info = _tables.read_table_header(path)
    if not isinstance(info.fmt, int):
        raise _tables.TableFileError(f"{path!r} holds a {info.fmt} table, not row-wise "
                                     f"quantized rows; load it with EmbeddingBag.from_file")
    packed, info = mapped_tensor(path, fmt=bits, rows=rows, dim=dim)
    new = cls.from_packed(packed, bits=info.fmt, dim=info.dim, mode=mode,
                          include_last_offset=include_last_offset, padding_idx=padding_idx,
                          placement="keep")
    new.table_file = path
    return new


def float_bag_from_file(cls, path, *, dtype=None, dim: Optional[int] = None,
                        rows: Optional[int] = None, mode: str = "mean",
                        include_last_offset: bool = False, padding_idx: Optional[int] = None,
                        **kwargs):
    """``cls(rows, D, _weight=<mapped table>, placement="keep", ...)`` over a float table file
    (the weight does not require grad)."""
    path = os.fspath(path)
    info = _tables.read_table_header(path)
    if isinstance(info.fmt, int):
        raise _tables.TableFileError(f"{path!r} holds {info.fmt}-bit quantized rows, not a float "
                                     f"table; load it with QuantizedEmbeddingBag.from_file")
    weight, info = mapped_tensor(path, fmt=dtype, rows=rows, dim=dim)
    new = cls(info.rows, info.dim, mode=mode, include_last_offset=include_last_offset,
              padding_idx=padding_idx, _weight=weight, placement="keep", dtype=weight.dtype,
              **kwargs)
    new.weight.requires_grad_(False)
    new.table_file = path
    return new


def collection_from_files(cls, files, *, bag_cls, quantized_cls, config_cls,
                          feature_names=None, pooling="sum", is_weighted: bool = False):
    """An ``EmbeddingBagCollection`` whose tables are the table files ``files`` (``{table name:
    path}``, in order): a float table mapped as :func:`float_bag_from_file` maps it, a quantized
    one as :func:`quantized_bag_from_file`; its config's rows, D and format read from the file
    (a quantized table's ``data_type`` is ``"INT8"``, ``"INT4"`` or ``"INT2"``).
    ``feature_names``: ``{table name: [feature, ...]}`` (default: each table is one feature of its
    name; ``pooling``: one for every table, or ``{table name: pooling}``).  ``bag_cls`` /
    ``quantized_cls`` / ``config_cls``: the float and quantized table modules and the config
    class (passed in, so that this module imports none of them)."""
    feature_names = dict(feature_names or {})
    unknown = set(feature_names) - set(files)
    if unknown:
        raise ValueError(f"feature_names names tables that files lacks: {sorted(unknown)}")
    if isinstance(pooling, Mapping):
        missing = set(files) - set(pooling)
        if missing or set(pooling) - set(files):
            raise ValueError(f"pooling must name every table of files and no other; missing "
                             f"{sorted(missing)}, extra {sorted(set(pooling) - set(files))}")
        modes = dict(pooling)
    else:
        modes = {name: pooling for name in files}
    configs, bags = [], {}
    for name, path in files.items():
        mode = modes[name]
        if isinstance(_tables.read_table_header(path).fmt, int):
            bag = quantized_bag_from_file(quantized_cls, path, mode=mode,
                                          include_last_offset=True)
            data_type = f"INT{bag.bits}"
        else:
            bag = float_bag_from_file(bag_cls, path, mode=mode, include_last_offset=True)
            bag.output_dtype = torch.float32
            data_type = bag.weight.dtype
        bags[name] = bag
        configs.append(config_cls(bag.num_embeddings, bag.embedding_dim, name=name,
                                  feature_names=list(feature_names.get(name, [name])),
                                  pooling=mode, data_type=data_type))
    # built on one-row stand-ins (nothing the size of the tables is allocated), then swapped
    stand_ins = [config_cls(1, c.embedding_dim, name=c.name,
                            feature_names=c.feature_names, pooling=c.pooling)
                 for c in configs]
    new = cls(stand_ins, is_weighted=is_weighted, placement="keep")
    for name, bag in bags.items():
        new.embedding_bags[name] = bag
    new._configs = configs
    return new
