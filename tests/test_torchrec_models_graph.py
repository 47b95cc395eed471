"""TorchRec's DLRM and DLRM_DCN (torchrec.models) whose float EmbeddingBagCollection went through
perfkernels.torch.convert() (float32 tables, and 4-bit rows): torchrec.fx.symbolic_trace traces
them and torch.export exports them, and the graphs answer as the stock model does with the same
table rows (the 4-bit tables' rows dequantized into a stock copy)."""
import copy
import warnings

import pytest

torch = pytest.importorskip("torch")

import perfkernels.torch as pkt  # noqa: E402

FEATURES = ["f0", "f1", "f2"]


def build(torchrec, arch):
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    torch.manual_seed(0)
    tables = [torchrec.EmbeddingBagConfig(num_embeddings=50, embedding_dim=8, name=f"t{i}",
                                          feature_names=[f], pooling=torchrec.PoolingType.SUM
                                          if i else torchrec.PoolingType.MEAN)
              for i, f in enumerate(FEATURES)]
    ebc = torchrec.EmbeddingBagCollection(tables=tables)
    if arch == "DLRM":
        return DLRM(embedding_bag_collection=ebc, dense_in_features=4,
                    dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1])
    return DLRM_DCN(embedding_bag_collection=ebc, dense_in_features=4,
                    dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1],
                    dcn_num_layers=2, dcn_low_rank_dim=4)


def inputs(torchrec, seed, lengths_seed=None):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (5 * len(FEATURES),), generator=torch.Generator().manual_seed(
        seed if lengths_seed is None else lengths_seed))
    values = torch.randint(0, 50, (int(lengths.sum()),), generator=gen)
    return (torch.rand(5, 4, generator=gen),
            torchrec.KeyedJaggedTensor.from_lengths_sync(FEATURES, values, lengths))


def reference(model, converted):
    """The stock model holding the converted tables' rows (dequantized where they are packed)."""
    ref = copy.deepcopy(model)
    ours = converted.sparse_arch.embedding_bag_collection.embedding_bags
    with torch.no_grad():
        for name, bag in ref.sparse_arch.embedding_bag_collection.embedding_bags.items():
            table = ours[name]
            bag.weight.copy_(table.dequantize() if hasattr(table, "dequantize") else table.weight)
    return ref


@pytest.mark.parametrize("arch", ["DLRM", "DLRM_DCN"])
@pytest.mark.parametrize("convert_kwargs", [{}, {"bits": 4}], ids=["float", "bits4"])
def test_symbolic_trace_and_export_of_converted_model(torchrec, arch, convert_kwargs):
    import torchrec.fx
    model = build(torchrec, arch).eval()
    converted = pkt.convert(model, **convert_kwargs)
    assert isinstance(converted.sparse_arch.embedding_bag_collection,
                      torchrec.EmbeddingBagCollection)
    ref = reference(model, converted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torchrec.fx.symbolic_trace(converted)
        exported = torch.export.export(converted, inputs(torchrec, 0), strict=False).module()
    for seed in range(1, 4):       # inputs other than the traced / exported one
        dense, kjt = inputs(torchrec, seed)
        with torch.no_grad():
            expected = ref(dense, kjt)
            torch.testing.assert_close(traced(dense, kjt), expected, rtol=1e-5, atol=1e-6)
            # (the export's shapes are static: the traced lengths, other IDs and dense inputs)
            dense, kjt = inputs(torchrec, seed, lengths_seed=0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.testing.assert_close(exported(dense, kjt), ref(dense, kjt),
                                           rtol=1e-5, atol=1e-6)
