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
                  dim: Optional[int] = None, populate: bool = False
                  ) -> tuple[Tensor, _tables.TableInfo]:
    """The table file at ``path`` as a CPU tensor over a copy-on-write mapping of it (uint8
    packed rows, or float32/float16/bfloat16 ``[rows, D]``), and its header; ``populate``: map
    every page now (:func:`perfkernels.tables.load_table`)."""
    info = _tables.read_table_header(path)
    a = _tables.load_table(path, fmt=fmt, rows=rows, dim=dim, mode="c", populate=populate)
    if info.fmt == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16), info
    return torch.from_numpy(a), info


def quantized_bag_from_file(cls, path, *, bits: Optional[int] = None, dim: Optional[int] = None,
                            rows: Optional[int] = None, mode: str = "sum",
                            include_last_offset: bool = False,
                            padding_idx: Optional[int] = None, populate: bool = False):
    """``cls.from_packed`` over the mapped rows of a quantized table file."""
    path = os.fspath(path)
    info = _tables.read_table_header(path)
    if not isinstance(info.fmt, int):
        raise _tables.TableFileError(f"{path!r} holds a {info.fmt} table, not row-wise "
                                     f"quantized rows; load it with EmbeddingBag.from_file")
    packed, info = mapped_tensor(path, fmt=bits, rows=rows, dim=dim, populate=populate)
    new = cls.from_packed(packed, bits=info.fmt, dim=info.dim, mode=mode,
                          include_last_offset=include_last_offset, padding_idx=padding_idx,
                          placement="keep")
    new.table_file = path
    return new


def float_bag_from_file(cls, path, *, dtype=None, dim: Optional[int] = None,
                        rows: Optional[int] = None, mode: str = "mean",
                        include_last_offset: bool = False, padding_idx: Optional[int] = None,
                        populate: bool = False, **kwargs):
    """``cls(rows, D, _weight=<mapped table>, placement="keep", ...)`` over a float table file
    (the weight does not require grad)."""
    path = os.fspath(path)
    info = _tables.read_table_header(path)
    if isinstance(info.fmt, int):
        raise _tables.TableFileError(f"{path!r} holds {info.fmt}-bit quantized rows, not a float "
                                     f"table; load it with QuantizedEmbeddingBag.from_file")
    weight, info = mapped_tensor(path, fmt=dtype, rows=rows, dim=dim, populate=populate)
    new = cls(info.rows, info.dim, mode=mode, include_last_offset=include_last_offset,
              padding_idx=padding_idx, _weight=weight, placement="keep", dtype=weight.dtype,
              **kwargs)
    new.weight.requires_grad_(False)
    new.table_file = path
    return new


def _pooling_modes(names, pooling) -> dict:
    """``{table name: pooling}`` from one pooling for every table or a mapping naming each."""
    if isinstance(pooling, Mapping):
        missing = set(names) - set(pooling)
        if missing or set(pooling) - set(names):
            raise ValueError(f"pooling must name every table and no other; missing "
                             f"{sorted(missing)}, extra {sorted(set(pooling) - set(names))}")
        return dict(pooling)
    return {name: pooling for name in names}


def _collection_of(cls, bags: dict, *, config_cls, feature_names, modes: dict,
                   is_weighted: bool):
    """An ``EmbeddingBagCollection`` (``cls``) whose tables are the modules ``bags`` (``{table
    name: bag}``, in order, each with ``include_last_offset`` and its pooling set): built on
    one-row stand-ins (nothing the size of the tables is allocated), then the bags swapped in."""
    configs = []
    for name, bag in bags.items():
        bits = getattr(bag, "bits", None)
        if bits:
            data_type = f"INT{bits}"
        else:
            bag.output_dtype = torch.float32
            data_type = bag.weight.dtype
        configs.append(config_cls(bag.num_embeddings, bag.embedding_dim, name=name,
                                  feature_names=list(feature_names.get(name, [name])),
                                  pooling=modes[name], data_type=data_type))
    stand_ins = [config_cls(1, c.embedding_dim, name=c.name,
                            feature_names=c.feature_names, pooling=c.pooling)
                 for c in configs]
    new = cls(stand_ins, is_weighted=is_weighted, placement="keep")
    for name, bag in bags.items():
        new.embedding_bags[name] = bag
    new._configs = configs
    return new


def _check_names(what: str, given, names) -> None:
    """A ``{table name: ...}`` argument ``what`` may name only the tables given."""
    unknown = set(given) - set(names) if isinstance(given, Mapping) else set()
    if unknown:
        raise ValueError(f"{what} names tables that are not given: {sorted(unknown)}")


def _check_feature_names(feature_names, names) -> dict:
    feature_names = dict(feature_names or {})
    _check_names("feature_names", feature_names, names)
    return feature_names


def collection_from_files(cls, files, *, bag_cls, quantized_cls, config_cls,
                          feature_names=None, pooling="sum", is_weighted: bool = False,
                          populate: bool = False):
    """An ``EmbeddingBagCollection`` whose tables are the table files ``files`` (``{table name:
    path}``, in order): a float table mapped as :func:`float_bag_from_file` maps it, a quantized
    one as :func:`quantized_bag_from_file`; its config's rows, D and format read from the file
    (a quantized table's ``data_type`` is ``"INT8"``, ``"INT4"`` or ``"INT2"``).
    ``feature_names``: ``{table name: [feature, ...]}`` (default: each table is one feature of its
    name; ``pooling``: one for every table, or ``{table name: pooling}``).  ``bag_cls`` /
    ``quantized_cls`` / ``config_cls``: the float and quantized table modules and the config
    class (passed in, so that this module imports none of them)."""
    feature_names = _check_feature_names(feature_names, files)
    modes = _pooling_modes(files, pooling)
    bags = {}
    for name, path in files.items():
        if isinstance(_tables.read_table_header(path).fmt, int):
            bags[name] = quantized_bag_from_file(quantized_cls, path, mode=modes[name],
                                                 include_last_offset=True, populate=populate)
        else:
            bags[name] = float_bag_from_file(bag_cls, path, mode=modes[name],
                                             include_last_offset=True, populate=populate)
    return _collection_of(cls, bags, config_cls=config_cls, feature_names=feature_names,
                          modes=modes, is_weighted=is_weighted)


def _table_tensor(name: str, table) -> Tensor:
    """A table given to ``from_tables`` as a tensor over the same memory (never a copy)."""
    if isinstance(table, np.ndarray):
        if not table.flags.writeable:
            # torch has no read-only tensors: a write (an optimizer step, load_state_dict) into
            # a read-only mapping would kill the process
            raise ValueError(f"table {name!r} is a read-only array; map a table file with "
                             f"EmbeddingBagCollection.from_files (copy-on-write) or pass a "
                             f"writable array")
        if table.dtype.name == "bfloat16":
            return torch.from_numpy(table.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(table)
    if isinstance(table, Tensor):
        return table
    raise TypeError(f"table {name!r} must be a NumPy array or a torch tensor; got "
                    f"{type(table).__name__}")


def collection_from_tables(cls, tables, *, bag_cls, quantized_cls, config_cls, bits=None,
                           dims=None, feature_names=None, pooling="sum",
                           is_weighted: bool = False):
    """An ``EmbeddingBagCollection`` over tables in memory (``{table name: table}``, in order),
    each used in place: float32 / float16 / bfloat16 ``[rows, D]`` tables, or packed 8/4/2-bit
    rows (uint8, as :func:`perfkernels.quantize_rowwise` returns them) where ``bits`` (one value
    for every packed table, or ``{table name: bits}``) gives their bits and ``dims`` (``{table
    name: D}``) their D where the row's bytes leave it open (an odd D of 4-bit rows)."""
    if not isinstance(tables, Mapping):
        raise TypeError(f"tables must map table names to tables; got {type(tables).__name__}")
    feature_names = _check_feature_names(feature_names, tables)
    modes = _pooling_modes(tables, pooling)
    _check_names("bits", bits, tables)
    _check_names("dims", dims, tables)
    if dims is not None and not isinstance(dims, Mapping):
        raise TypeError(f"dims must map table names to D; got {type(dims).__name__}")
    dims = dims or {}
    bags = {}
    for name, table in tables.items():
        t = _table_tensor(name, table)
        if t.dim() != 2:
            raise ValueError(f"table {name!r} must be 2-D; got shape {tuple(t.shape)}")
        b = bits.get(name) if isinstance(bits, Mapping) else bits
        if t.dtype == torch.uint8:
            if not b:
                raise ValueError(f"table {name!r} holds packed uint8 rows: give its bits "
                                 f"(bits={{{name!r}: 4}} or bits=4)")
            bags[name] = quantized_cls.from_packed(t, bits=b, dim=dims.get(name),
                                                   mode=modes[name], include_last_offset=True,
                                                   placement="keep")
        elif t.dtype in (torch.float32, torch.float16, torch.bfloat16):
            if b and isinstance(bits, Mapping):
                raise ValueError(f"bits names table {name!r}, a {t.dtype} table, not packed "
                                 f"rows")
            if name in dims and dims[name] != t.shape[1]:
                raise ValueError(f"dims gives table {name!r} D = {dims[name]}; the table has "
                                 f"{t.shape[1]} columns")
            bag = bag_cls(t.shape[0], t.shape[1], mode=modes[name], include_last_offset=True,
                          _weight=t, placement="keep", dtype=t.dtype)
            bags[name] = bag
        else:
            raise TypeError(f"table {name!r} must be float32, float16, bfloat16 or packed uint8 "
                            f"rows; got {t.dtype}")
    return _collection_of(cls, bags, config_cls=config_cls, feature_names=feature_names,
                          modes=modes, is_weighted=is_weighted)
