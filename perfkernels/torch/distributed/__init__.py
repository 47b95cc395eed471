"""perfkernels.torch.distributed: embedding tables sharded over the processes and hosts of a
``torch.distributed`` process group (model parallelism for the tables, data parallelism for the
rest of the model).

    import torch.distributed as dist
    from perfkernels.torch import EmbeddingBagConfig, KeyedJaggedTensor
    from perfkernels.torch import distributed as pkd

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))   # under torchrun
    tables = [EmbeddingBagConfig(1_000_000, 64, name="user", feature_names=["user"]), ...]
    plan = pkd.plan(tables, dist.get_world_size(), memory_budget=8 << 30,
                    pooling_factors={"user": 20})
    print(plan)                                          # table -> ranks, bytes, lookups
    ebc = pkd.ShardedEmbeddingBagCollection(tables, plan,
                                            fused_optimizer=("rowwise_adagrad", {"lr": 0.01}))
    pooled = ebc(KeyedJaggedTensor(keys, values, lengths=lengths)).values()   # this rank's batch

* :func:`plan` / :class:`ShardingPlan`: table-wise, row-wise, table-row-wise and data-parallel
  placement under a memory budget, balancing lookup cost, printed as a table;
* :class:`ShardedEmbeddingBagCollection`: the sharded counterpart of
  :class:`perfkernels.torch.EmbeddingBagCollection` (every table format, fused optimizers on the
  owners, ``all_to_all_single`` on any backend);
* :class:`ShardedEmbeddingCollection`: the same for the unpooled
  :class:`perfkernels.torch.EmbeddingCollection` (``{feature: JaggedTensor}``, one row per ID);
* :func:`save_checkpoint` / :func:`load_checkpoint` (``torch.distributed.checkpoint``, with
  resharding), :func:`export_tables` (one file of full tables for serving) and
  :func:`export_table_files` (a table file per table, for servers that map them);
* :func:`check_peers` (gloo's monitored barrier) and :class:`CollectiveError`, what a collective
  raises when another rank failed, died or timed out.

Importing this module initialises nothing; the process group is the caller's.
"""
from ._comm import CollectiveError, check_peers
from ._plan import (DATA_PARALLEL, ROW_WISE, SHARDING_TYPES, TABLE_ROW_WISE, TABLE_WISE,
                    ShardingPlan, Table, TableSharding, plan)
from ._sharded import ShardedEmbeddingBagCollection, initial_rows
from ._sharded_sequence import ShardedEmbeddingCollection
from ._checkpoint import export_table_files, export_tables, load_checkpoint, save_checkpoint

__all__ = [
    "plan", "ShardingPlan", "TableSharding", "Table", "SHARDING_TYPES",
    "TABLE_WISE", "ROW_WISE", "TABLE_ROW_WISE", "DATA_PARALLEL",
    "ShardedEmbeddingBagCollection", "ShardedEmbeddingCollection", "initial_rows",
    "save_checkpoint", "load_checkpoint", "export_tables", "export_table_files",
    "check_peers", "CollectiveError",
]
