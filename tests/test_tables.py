"""perfkernels.tables: tables built block by block from row sources, and table files mapped by
mmap (atomic saves, checked headers, shared pages)."""
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import ml_dtypes
import numpy as np
import pytest

import perfkernels as pk
from perfkernels import tables as T


def _documented_init(seed, rows, dim, dist="normal"):
    """The documented SeededInit rule, written out: chunks of 4096 rows, chunk c drawn by
    PCG64(SeedSequence(seed, spawn_key=(c,)))."""
    parts = []
    for c in range(-(-rows // 4096)):
        n = min(4096, rows - c * 4096)
        g = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(c,))))
        if dist == "normal":
            parts.append(g.standard_normal((n, dim), dtype=np.float32))
        else:
            parts.append(g.random((n, dim), dtype=np.float32))
    return np.concatenate(parts) if parts else np.empty((0, dim), np.float32)


# ----------------------------------------------------------------------------- sources

def test_seeded_init_is_the_documented_stream_whatever_the_block():
    src = T.SeededInit(10_000, 24, seed=7)
    want = _documented_init(7, 10_000, 24)
    np.testing.assert_array_equal(src.block(0, 10_000), want)
    for start, stop in [(0, 1), (4095, 4097), (123, 9_999), (8192, 10_000), (5000, 5000)]:
        np.testing.assert_array_equal(src.block(start, stop), want[start:stop])
    assert abs(float(want.mean())) < 0.02 and abs(float(want.std()) - 1) < 0.02
    other = T.SeededInit(10_000, 24, seed=8).block(0, 100)
    assert not np.array_equal(other, want[:100])


def test_seeded_init_uniform_bounds_and_scaling():
    src = T.SeededInit(5000, 8, seed=1, dist="uniform")
    bound = (1 / 5000) ** 0.5
    x = src.block(0, 5000)
    assert x.min() >= -bound and x.max() < bound
    u = _documented_init(1, 5000, 8, "uniform")
    np.testing.assert_array_equal(x, u * np.float32(2 * bound) + np.float32(-bound))
    s = T.SeededInit(100, 4, seed=2, mean=3.0, std=0.5).block(0, 100)
    np.testing.assert_array_equal(s, _documented_init(2, 100, 4) * np.float32(0.5)
                                  + np.float32(3.0))


@pytest.mark.parametrize("bad", [dict(rows=-1, dim=4), dict(rows=4, dim=0),
                                 dict(rows=4, dim=4, seed=-1), dict(rows=4, dim=4, dist="x")])
def test_seeded_init_refuses_bad_arguments(bad):
    with pytest.raises(ValueError):
        T.SeededInit(**bad)


def test_source_block_out_of_range():
    with pytest.raises(ValueError, match="outside"):
        T.SeededInit(10, 4).block(5, 11)


# ----------------------------------------------------------------------------- building

@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("threads", [1, 2])
def test_build_quantized_equals_torch_prepack_of_the_whole_table(bits, threads):
    torch = pytest.importorskip("torch")
    rows, dim = 9_000, 32
    src = T.SeededInit(rows, dim, seed=3)
    packed = T.build_table(src, bits, block_rows=1_000, threads=threads)
    whole = torch.from_numpy(_documented_init(3, rows, dim))
    op = {8: torch.ops.quantized.embedding_bag_byte_prepack,
          4: torch.ops.quantized.embedding_bag_4bit_prepack,
          2: torch.ops.quantized.embedding_bag_2bit_prepack}[bits]
    np.testing.assert_array_equal(packed, op(whole).numpy())
    assert pk.placement_of(packed) is not None or packed.nbytes < (2 << 20)


@pytest.mark.parametrize("rows, block_rows", [(300, 1), (5000, 777), (5000, 4096),
                                              (5000, 50_000)])
def test_build_does_not_depend_on_the_block_size(rows, block_rows):
    src = T.SeededInit(rows, 20, seed=11)
    np.testing.assert_array_equal(T.build_table(src, 4, block_rows=block_rows, threads=2),
                                  pk.quantize_rowwise(_documented_init(11, rows, 20), 4))


def test_build_float_formats():
    x = _documented_init(5, 3000, 40)
    src = T.ArraySource(x)
    np.testing.assert_array_equal(T.build_table(src, "float32", block_rows=700), x)
    np.testing.assert_array_equal(T.build_table(src, np.float16, block_rows=700),
                                  x.astype(np.float16))
    bf = T.build_table(src, "bfloat16", block_rows=700)
    assert bf.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(bf.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_build_from_npy_file_by_mmap(tmp_path):
    x = _documented_init(9, 2000, 16).astype(np.float16)
    np.save(tmp_path / "t.npy", x)
    src = T.npy_source(tmp_path / "t.npy")
    assert isinstance(src.array, np.memmap)
    np.testing.assert_array_equal(T.build_table(src, 8, block_rows=300),
                                  pk.quantize_rowwise(x, 8))
    np.testing.assert_array_equal(T.build_table(str(tmp_path / "t.npy"), "float16"), x)


def test_build_from_checkpoint_tensor(tmp_path):
    torch = pytest.importorskip("torch")
    w = torch.randn(1500, 12, generator=torch.Generator().manual_seed(0))
    torch.save({"emb.weight": w, "other": torch.zeros(3)}, tmp_path / "ck.pt")
    src = T.checkpoint_source(tmp_path / "ck.pt", "emb.weight")
    np.testing.assert_array_equal(T.build_table(src, 4, block_rows=256),
                                  torch.ops.quantized.embedding_bag_4bit_prepack(w).numpy())
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        T.checkpoint_source(tmp_path / "ck.pt", "nope")
    bf = w.to(torch.bfloat16)
    np.testing.assert_array_equal(T.build_table(bf, "float32"), bf.float().numpy())


def test_build_from_callback_and_its_errors():
    x = _documented_init(2, 1000, 8)
    calls = []

    def fn(a, b):
        calls.append((a, b))
        return x[a:b]
    out = T.build_table(T.CallbackSource(1000, 8, fn), 2, block_rows=128, threads=1)
    np.testing.assert_array_equal(out, pk.quantize_rowwise(x, 2))
    assert max(b - a for a, b in calls) == 128 and sorted(calls)[0] == (0, 128)
    bad = T.CallbackSource(1000, 8, lambda a, b: np.zeros((b - a, 9), np.float32))
    with pytest.raises(ValueError, match="callback returned"):
        T.build_table(bad, 8)


def test_build_refuses_bad_format_and_out():
    src = T.SeededInit(10, 4)
    for fmt in (3, "int8", "float64", True):
        with pytest.raises(ValueError, match="table format"):
            T.build_table(src, fmt)
    with pytest.raises(ValueError, match="out must be uint8 of shape"):
        T.build_table(src, 8, out=np.zeros((10, 11), np.uint8))


def test_build_tables_collection():
    srcs = {"a": T.SeededInit(300, 8, 1), "b": T.SeededInit(50, 16, 2)}
    out = T.build_tables(srcs, {"a": 4, "b": "float16"}, block_rows=64)
    np.testing.assert_array_equal(out["a"], pk.quantize_rowwise(_documented_init(1, 300, 8), 4))
    np.testing.assert_array_equal(out["b"], _documented_init(2, 50, 16).astype(np.float16))


def test_build_progress_bar(capsys):
    pytest.importorskip("tqdm")
    T.build_table(T.SeededInit(100, 4), 8, block_rows=10, progress=True)
    assert "100/100" in capsys.readouterr().err


# ----------------------------------------------------------------------------- files

@pytest.mark.parametrize("fmt", [8, 4, 2, "float32", "float16", "bfloat16"])
def test_save_load_round_trip(tmp_path, fmt):
    src = T.SeededInit(700, 24, 4)
    table = T.build_table(src, fmt)
    path = tmp_path / "t.pkt"
    info = T.save_table(path, table, bits=fmt if isinstance(fmt, int) else None,
                        dim=24 if isinstance(fmt, int) else None)
    assert info == T.read_table_header(path) and info.data_offset == 4096
    m = T.load_table(path)
    assert not m.flags.writeable and m.dtype == table.dtype
    np.testing.assert_array_equal(m.view(np.uint8), table.view(np.uint8))
    # the header, read back by hand from the documented layout
    with open(path, "rb") as f:
        head = f.read(60)
    magic, version, code, rows, dim, row_bytes, off, nbytes = struct.unpack("<8sIIQQQQQ",
                                                                            head[:56])
    assert (magic, version, rows, dim, off) == (b"PKTABLE\0", 1, 700, 24, 4096)
    assert code == {"float32": 32, "float16": 16, "bfloat16": 17}.get(fmt, fmt)
    assert struct.unpack("<I", head[56:])[0] == zlib.crc32(head[:56])
    assert os.path.getsize(path) == 4096 + nbytes == 4096 + 700 * row_bytes
    # built straight into a file: the same file contents
    T.build_table_file(tmp_path / "u.pkt", src, fmt, block_rows=100)
    assert (tmp_path / "u.pkt").read_bytes() == path.read_bytes()


def test_big_tables_start_on_2mib(tmp_path):
    info = T.build_table_file(tmp_path / "b.pkt", T.SeededInit(20_000, 64, 0), "float32")
    assert info.data_offset == 2 << 20


def test_copy_on_write_mapping_never_writes_the_file(tmp_path):
    path = tmp_path / "t.pkt"
    T.save_table(path, np.ones((10, 4), np.float32))
    m = T.load_table(path, mode="c")
    m[:] = 5
    np.testing.assert_array_equal(T.load_table(path), np.ones((10, 4), np.float32))
    with pytest.raises(ValueError, match="assignment destination is read-only"):
        T.load_table(path)[0, 0] = 1


def _good_file(tmp_path):
    path = tmp_path / "t.pkt"
    T.save_table(path, T.build_table(T.SeededInit(100, 8), 4), bits=4, dim=8)
    return path


def test_load_refuses_truncated_foreign_other_version_and_damaged(tmp_path):
    path = _good_file(tmp_path)
    data = path.read_bytes()
    bad = tmp_path / "bad.pkt"
    bad.write_bytes(data[:-1])
    with pytest.raises(T.TableFileError, match=r"bad\.pkt.*truncated: 4895 bytes.*says 4896"):
        T.load_table(bad)
    bad.write_bytes(data[:30])
    with pytest.raises(T.TableFileError, match="truncated"):
        T.load_table(bad)
    bad.write_bytes(b"\x93NUMPY" + data[6:])
    with pytest.raises(T.TableFileError, match="not a perfkernels table file"):
        T.load_table(bad)
    bad.write_bytes(b"")
    with pytest.raises(T.TableFileError, match="not a perfkernels table file"):
        T.load_table(bad)
    v2 = bytearray(data)
    v2[8:12] = struct.pack("<I", 2)
    bad.write_bytes(bytes(v2))
    with pytest.raises(T.TableFileError, match="version 2"):
        T.load_table(bad)
    dmg = bytearray(data)
    dmg[16] ^= 1          # rows changed, CRC not updated
    bad.write_bytes(bytes(dmg))
    with pytest.raises(T.TableFileError, match="damaged header"):
        T.load_table(bad)


def test_load_refuses_what_the_caller_does_not_expect(tmp_path):
    path = _good_file(tmp_path)
    with pytest.raises(T.TableFileError, match=r"t\.pkt.*format 4; expected 8"):
        T.load_table(path, fmt=8)
    with pytest.raises(T.TableFileError, match="rows 100; expected 99"):
        T.load_table(path, rows=99)
    with pytest.raises(T.TableFileError, match="D 8; expected 16"):
        T.load_table(path, dim=16)
    with pytest.raises(ValueError, match="mode"):
        T.load_table(path, mode="w")


def test_save_is_atomic(tmp_path):
    path = _good_file(tmp_path)
    before = path.read_bytes()

    def boom(a, b):
        if a > 0:
            raise RuntimeError("source failed")
        return np.zeros((b - a, 8), np.float32)
    with pytest.raises(RuntimeError, match="source failed"):
        T.build_table_file(path, T.CallbackSource(100, 8, boom), 4, block_rows=10, threads=1)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["t.pkt"]          # no temporary file left behind
    with pytest.raises(ValueError, match="needs bits"):
        T.save_table(tmp_path / "x.pkt", np.zeros((3, 12), np.uint8))
    with pytest.raises(ValueError, match="20-byte rows"):
        T.save_table(tmp_path / "x.pkt", np.zeros((3, 12), np.uint8), bits=8, dim=12)
    assert os.listdir(tmp_path) == ["t.pkt"]


def test_saved_file_mode_follows_umask(tmp_path):
    """A table file is readable by other users as open() would make it (mkstemp's 0600 is only
    the temporary file's): a server running under another account can map it."""
    old = os.umask(0o027)
    try:
        T.save_table(tmp_path / "a.pkt", np.zeros((5, 8), np.float32))
        T.build_table_file(tmp_path / "b.pkt", T.SeededInit(5, 8, seed=1), 8)
    finally:
        os.umask(old)
    for name in ("a.pkt", "b.pkt"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o640, name


def _mapped_rss(a) -> int:
    """Resident bytes of the mappings under array ``a`` (/proc/self/smaps)."""
    lo = a.__array_interface__["data"][0]
    hi, rss, inside = lo + a.nbytes, 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                s, e = (int(x, 16) for x in first.split("-"))
                inside = s < hi and lo < e
            elif inside and first == "Rss:":
                rss += int(line.split()[1]) * 1024
    return rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_populate_maps_every_page_at_load(tmp_path):
    src = T.SeededInit(30_000, 64, seed=5)
    path = tmp_path / "p.pkt"
    T.build_table_file(path, src, 8)                   # 30000 x 72 bytes, in the page cache
    lazy = T.load_table(path)
    assert _mapped_rss(lazy) < lazy.nbytes // 2        # nothing touched yet
    eager = T.load_table(path, populate=True)
    assert _mapped_rss(eager) >= eager.nbytes
    want = np.array(lazy)                              # the bytes read page by page
    np.testing.assert_array_equal(eager, want)
    assert not eager.flags.writeable
    cow = T.load_table(path, mode="c", populate=True)
    assert _mapped_rss(cow) >= cow.nbytes
    np.testing.assert_array_equal(cow, want)


# ----------------------------------------------------------------------------- torch modules

def test_quantized_bag_from_file_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from perfkernels.torch import QuantizedEmbeddingBag
    path = tmp_path / "q.pkt"
    T.build_table_file(path, T.SeededInit(1000, 16, 6), 4)
    bag = QuantizedEmbeddingBag.from_file(path, bits=4)
    assert bag.table_file == str(path) and (bag.num_embeddings, bag.embedding_dim) == (1000, 16)
    idx = torch.randint(0, 1000, (50,), generator=torch.Generator().manual_seed(1))
    offs = torch.tensor([0, 7, 7, 30])
    want = torch.ops.quantized.embedding_bag_4bit_rowwise_offsets(
        torch.from_numpy(T.load_table(path).copy()), idx, offs)
    torch.testing.assert_close(bag(idx, offs), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(T.TableFileError, match="format 4; expected 8"):
        QuantizedEmbeddingBag.from_file(path, bits=8)
    T.save_table(tmp_path / "f.pkt", np.zeros((4, 4), np.float32))
    with pytest.raises(T.TableFileError, match="EmbeddingBag.from_file"):
        QuantizedEmbeddingBag.from_file(tmp_path / "f.pkt")


@pytest.mark.parametrize("fmt", ["float32", "float16", "bfloat16"])
def test_float_bag_and_collection_from_files(tmp_path, fmt):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from perfkernels.torch import EmbeddingBag, EmbeddingBagCollection, KeyedJaggedTensor
    files = {}
    for i, (rows, dim) in enumerate([(500, 16), (40, 8)]):
        files[f"t{i}"] = str(tmp_path / f"t{i}.pkt")
        T.build_table_file(files[f"t{i}"], T.SeededInit(rows, dim, i), fmt)
    bag = EmbeddingBag.from_file(files["t0"], mode="sum")
    assert not bag.weight.requires_grad and bag.weight.dtype == getattr(torch, fmt)
    ref = torch.from_numpy(_documented_init(0, 500, 16)).to(getattr(torch, fmt))
    idx = torch.tensor([1, 499, 3, 3, 0])
    offs = torch.tensor([0, 2])
    torch.testing.assert_close(bag(idx, offs), F.embedding_bag(idx, ref, offs, mode="sum"))
    ebc = EmbeddingBagCollection.from_files(files, feature_names={"t1": ["f1", "g1"]})
    assert [c.num_embeddings for c in ebc.embedding_bag_configs()] == [500, 40]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["t0", "f1", "g1"], torch.tensor([5, 6, 7, 39, 0, 1, 2]), torch.tensor([1, 2, 2, 0, 1, 1]))
    out = ebc(kjt).values()
    t1 = torch.from_numpy(_documented_init(1, 40, 8)).to(getattr(torch, fmt)).float()
    t0 = ref.float()
    want = torch.cat([
        torch.stack([t0[5], t0[6] + t0[7]]),
        torch.stack([t1[39] + t1[0], torch.zeros(8)]),
        torch.stack([t1[1], t1[2]])], 1)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(T.TableFileError, match="rows 500; expected 10"):
        EmbeddingBag.from_file(files["t0"], rows=10)


def test_file_module_state_dict_holds_the_table(tmp_path):
    torch = pytest.importorskip("torch")
    from perfkernels.torch import QuantizedEmbeddingBag
    path = tmp_path / "q.pkt"
    T.build_table_file(path, T.SeededInit(64, 8, 1), 8)
    bag = QuantizedEmbeddingBag.from_file(path)
    sd = bag.state_dict()
    np.testing.assert_array_equal(sd["packed_weight"].numpy(), T.load_table(path))
    other = QuantizedEmbeddingBag(64, 8, dtype=8)
    other.load_state_dict(sd)
    np.testing.assert_array_equal(other.packed_weight.numpy(), T.load_table(path))
    with torch.no_grad():                    # a write copies the page; the file is unchanged
        bag.packed_weight.zero_()
    assert T.load_table(path).any()


# ----------------------------------------------------------------------------- memory

_RSS_CHILD = textwrap.dedent("""
    import sys, numpy as np
    from perfkernels import tables as T

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
    rows, dim = int(sys.argv[1]), int(sys.argv[2])
    src = T.SeededInit(rows, dim, 0)
    T.build_table(T.SeededInit(10_000, dim, 0), 4, threads=2)    # warm the pools and imports
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                          # VmHWM := VmRSS
    out = T.build_table(src, 4, threads=2, block_rows=16384)
    print(status("VmHWM") - before, out.nbytes)
""")


@pytest.mark.slow
def test_build_peak_memory_is_the_packed_table_plus_a_bounded_buffer():
    rows, dim = 1_000_000, 128          # float32: 512 MB; 4-bit: 68 MB
    r = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(rows), str(dim)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    grew, packed = map(int, r.stdout.split())
    buffer = 4 * 16384 * dim * 4 * 2            # 2 x threads blocks in flight, float + scratch
    assert grew <= packed + buffer + (32 << 20), (grew, packed)
    assert grew >= packed // 2                  # the measurement sees the table itself


_MAP_CHILD = textwrap.dedent("""
    import sys, numpy as np
    from perfkernels import tables as T
    path, use_torch = sys.argv[1], sys.argv[2] == "1"
    if use_torch:
        from perfkernels.torch import QuantizedEmbeddingBag
        a = QuantizedEmbeddingBag.from_file(path).packed_weight.numpy()
    else:
        a = T.load_table(path)
    total = int(a[:, ::4096 // a.shape[1] or 1].sum(dtype=np.int64))   # touch every page
    lo = a.__array_interface__["data"][0]
    hi = lo + a.nbytes
    fields = {}
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                s, e = (int(x, 16) for x in first.split("-"))
                inside = s < hi and lo < e
            elif inside and first.endswith(":") and line.split()[-1] == "kB":
                fields[first[:-1]] = fields.get(first[:-1], 0) + int(line.split()[1]) * 1024
    print(fields.get("Shared_Clean", 0) + fields.get("Shared_Dirty", 0),
          fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
          fields.get("FilePmdMapped", 0), total, flush=True)
    sys.stdin.read()
""")


@pytest.mark.slow
@pytest.mark.parametrize("use_torch", [False, True])
def test_two_processes_share_one_mapped_table(tmp_path, use_torch):
    path = tmp_path / "big.pkt"
    info = T.build_table_file(path, T.SeededInit(200_000, 128, 0), 8)   # 27 MB
    procs = []
    try:
        lines = []
        for _ in range(2):
            p = subprocess.Popen([sys.executable, "-c", _MAP_CHILD, str(path),
                                  "1" if use_torch else "0"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(p)
            lines.append(p.stdout.readline())
        shared, private, _, total1 = map(int, lines[1].split())
        total0 = int(lines[0].split()[3])
        assert total0 == total1
        assert private <= (1 << 20), lines          # the second process: ~no private copy
        assert shared >= 0.95 * info.data_bytes, lines
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)
