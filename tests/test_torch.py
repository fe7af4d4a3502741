"""torch tensors as values (round trips, refusals, the import rule, views) and ``shmcache.contrib.torch.CachedDataset``
under DataLoader workers (fork and spawn) and trainer processes sharing one cache."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import xxhash

torch = pytest.importorskip("torch", reason="torch is optional (pip install torch); CI installs the CPU build")

from shmcache import CapacityWarning, SharedCache, TooLargeWarning  # noqa: E402
from shmcache.codec import decode_value, encode_value  # noqa: E402
from shmcache.contrib.torch import CachedDataset  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from tests.workers import pinned  # noqa: E402

DTYPES = [torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32,
          torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
SHAPES = [(), (0,), (3, 0), (5,), (2, 3), (2, 1, 3)]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sample_tensor(dtype, shape=(2, 3)):
    """Values of every kind the dtype has: negatives, and for floats NaN, infinities and -0.0."""
    n = int(np.prod(shape))
    if dtype is torch.bool:
        return (torch.arange(n) % 2 == 1).reshape(shape)
    if dtype.is_floating_point or dtype.is_complex:
        special = [float("nan"), float("inf"), -float("inf"), -0.0, 1.5, -2.25]
        values = torch.tensor([special[i % len(special)] + (i // len(special)) for i in range(n)], dtype=torch.float64)
        t = values.to(dtype)
        return (t + 1j * torch.arange(n).to(dtype) if dtype.is_complex else t).reshape(shape)
    low = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -3
    return (torch.arange(n, dtype=torch.int64) * 7 + low).to(dtype).reshape(shape)


def raw(t) -> bytes:
    """The tensor's values, bit for bit, in C order."""
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.dtype is torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def same_tensor(a, b) -> bool:
    return type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b)


@pytest.fixture
def big(name):
    c = SharedCache(name, capacity_bytes=4 * 2**20, max_entries=256, create=True)
    yield c
    c.close()


# ---------------------------------------------------------------------------------------------------- values


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensor_round_trip_through_the_cache(big, dtype, shape):
    t = sample_tensor(dtype, shape)
    big.put("t", t)
    out = big.get("t")
    assert same_tensor(t, out) and out.is_contiguous()
    assert same_tensor(t, decode_value(encode_value(t)))
    assert same_tensor(t, big.get_many(["t"])[0])  # through another read path: the same decode


@pytest.mark.parametrize("make", [
    lambda t: t.T,
    lambda t: t[:, ::2],
    lambda t: t[1:, 1:3],
    lambda t: t[0].expand(3, 4),
    lambda t: t.to(torch.complex64).conj(),
    lambda t: torch._neg_view(t),
    lambda t: t.to(torch.bfloat16).T,
], ids=["transposed", "strided", "offset", "expanded", "conj", "neg-view", "bfloat16-transposed"])
def test_tensor_non_contiguous_stored_contiguous(big, make):
    t = make(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    assert not t.is_contiguous() or t.is_conj() or t.is_neg() or t.storage_offset()
    big.put("t", t)
    out = big.get("t")
    assert same_tensor(t, out) and out.is_contiguous() and not out.is_conj() and not out.is_neg()


def test_tensor_read_is_a_private_writable_copy(big):
    t = torch.arange(6, dtype=torch.int32)
    big.put("t", t)
    out = big.get("t")
    out += 100  # neither the cached value nor the tensor stored changes
    t[0] = -1
    assert big.get("t").tolist() == list(range(6)) and out.tolist() == list(range(100, 106))


def test_tensor_nested_in_tuples_lists_and_dicts_round_trip(big):
    image, label = sample_tensor(torch.float32, (3, 4, 4)), 7
    value = {"pair": (image, label), "many": [sample_tensor(torch.bfloat16, (2,)), sample_tensor(torch.uint8, ())],
             "arr": np.arange(3)}
    big.put("v", value)
    out = big.get("v")
    assert type(out["pair"]) is tuple and same_tensor(image, out["pair"][0]) and out["pair"][1] == label
    assert same_tensor(value["many"][0], out["many"][0]) and same_tensor(value["many"][1], out["many"][1])
    assert np.array_equal(out["arr"], np.arange(3))


def test_tensor_subclass_stored_as_a_tensor(big):
    big.put("p", torch.nn.Parameter(torch.ones(2), requires_grad=False))
    assert type(big.get("p")) is torch.Tensor and big.get("p").tolist() == [1.0, 1.0]


@pytest.mark.parametrize("make, says", [
    (lambda: torch.ones(2, requires_grad=True), ".detach()"),
    (lambda: torch.nn.Parameter(torch.ones(2)), ".detach()"),
    (lambda: torch.ones(2).to_sparse(), "to_dense()"),
    (lambda: torch.ones(2, 2).to_sparse_csr(), "to_dense()"),
    (lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8), "dequantize()"),
    (lambda: torch.ones(2, device="meta"), ".detach().cpu()"),
    (lambda: torch.ones(2, dtype=torch.float8_e4m3fn), "float8_e4m3fn"),
    (lambda: torch.ones(2, dtype=torch.complex32), "complex32"),
], ids=["requires-grad", "parameter", "sparse-coo", "sparse-csr", "quantized", "meta-device", "float8", "complex32"])
def test_tensor_refused_with_what_to_do(big, make, says):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own, on making a quantized or complex32 tensor
        t = make()
    for value in (t, (t, 1), [0, {"x": t}]):
        with pytest.raises(TypeError, match=f"(?s)tensor.*{says.replace('(', '[(]').replace(')', '[)]')}"):
            big.put("k", value)
        assert "k" not in big
    assert big.stats().puts == 0


def test_tensor_values_need_no_torch_until_one_is_read(name):
    """A process that stores and reads other values, views them and verifies a cache holding tensors never imports
    torch; reading a tensor imports it."""
    with SharedCache(name, capacity_bytes=2**20, max_entries=64, create=True) as c:
        c.put("tensor", torch.arange(4.0))
        c.put("pair", (torch.ones(2, dtype=torch.bfloat16), 3))
        code = textwrap.dedent(f"""
            import sys
            import numpy as np
            from shmcache import SharedCache
            c = SharedCache({name!r})
            c.put("b", b"x"); c.put("a", np.arange(3)); c.put("m", {{"k": (1, [2.5])}})
            assert c.get("b") == b"x" and c.get("a").tolist() == [0, 1, 2] and c.get("m") == {{"k": (1, [2.5])}}
            with c.view("a") as arr:
                assert arr.tolist() == [0, 1, 2]
            assert c.verify(deep=True).ok
            c.get_or_compute("computed", lambda: [1])
            before = "torch" in sys.modules
            t = c.get("tensor")
            print(before, "torch" in sys.modules, type(t).__module__, t.tolist())
            c.close()
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90,
                              env={**os.environ, "PYTHONPATH": REPO})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["False", "True", "torch", "[0.0,", "1.0,", "2.0,", "3.0]"]


def test_tensor_read_without_torch_says_what_is_missing(name):
    with SharedCache(name, capacity_bytes=2**20, max_entries=64, create=True) as c:
        c.put("tensor", torch.arange(4.0))
        code = textwrap.dedent(f"""
            import sys
            sys.modules["torch"] = None  # as if torch were not installed: importing it raises ImportError
            from shmcache import SharedCache
            c = SharedCache({name!r})
            try:
                c.get("tensor")
            except ModuleNotFoundError as exc:
                print(exc.name, "pip install torch" in str(exc))
            assert c.verify(deep=True).ok and "tensor" in c  # nothing taken for damage
            c.close()
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90,
                              env={**os.environ, "PYTHONPATH": REPO})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["torch", "True"]
        assert torch.equal(c.get("tensor"), torch.arange(4.0))


def test_tensor_verify_deep_checks_tensor_values(big):
    big.put("t", torch.arange(3.0))
    big.put("n", [torch.arange(2), 1])
    assert big.verify(deep=True).ok


# ---------------------------------------------------------------------------------------------------- view
# torch warns once per process that the view's array is not writable: true, and left to show (see view.py).


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_view_of_a_tensor_is_a_tensor_over_the_entry(big, dtype):
    t = sample_tensor(dtype, (4, 5))
    big.put("t", t)
    with big.view("t") as v:
        assert same_tensor(t, v)
        assert pinned(big, "t")
    del v
    big.put("t", 0)  # the pin ended with the tensor
    assert big.verify().ok


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_view_of_a_tensor_pinned_while_a_derived_tensor_lives(big):
    big.put("t", torch.arange(10, dtype=torch.int32))
    with big.view("t") as v:
        part = v[2:5]
        alias = v.numpy()
    del v
    for holder in ("part", "alias"):
        assert pinned(big, "t")
        if holder == "part":
            assert part.tolist() == [2, 3, 4]
            del part
        else:
            assert alias.tolist() == list(range(10))
            del alias
    big.put("t", 0)


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_view_of_a_tensor_outlives_the_block_until_dropped(big):
    big.put("t", torch.arange(4.0))
    with big.view("t") as v:
        pass
    assert v.tolist() == [0.0, 1.0, 2.0, 3.0]  # not revoked: still readable, still pinned
    assert pinned(big, "t")
    del v
    big.put("t", 0)


@pytest.mark.multiprocess
def test_view_of_a_tensor_cannot_be_written(name):
    """A write through the tensor faults (its memory is mapped read-only) and the cached value stays as it was."""
    with SharedCache(name, capacity_bytes=2**20, max_entries=64, create=True) as c:
        c.put("t", torch.arange(4.0))
        code = textwrap.dedent(f"""
            import warnings
            warnings.simplefilter("ignore")
            from shmcache import SharedCache
            c = SharedCache({name!r})
            with c.view("t") as v:
                print("viewed", flush=True)
                v.add_(1)
            print("wrote")
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90,
                              env={**os.environ, "PYTHONPATH": REPO, "PYTHONFAULTHANDLER": ""})
        assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stdout, proc.stderr)
        assert proc.stdout.split() == ["viewed"]
        assert c.get("t").tolist() == [0.0, 1.0, 2.0, 3.0] and c.verify(deep=True).ok
        c.put("t", 0)  # the dead process's pin is gone with it


# ---------------------------------------------------------------------------------------------------- CachedDataset


class CountingDataset(Dataset):
    """Sample ``i`` is (a tensor made from ``i``, ``i``, the tensor's checksum); each computation appends ``i`` to
    ``log`` (O_APPEND, one write per line), so computations can be counted across processes."""

    def __init__(self, n: int, log: str) -> None:
        self.n = n
        self.log = log

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        append_line(self.log, i)
        return make_sample(i)


def append_line(log: str, i: int) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{i} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


class Augment:
    """The random part, applied after the cache: flips sample ``i``'s image left to right or not and adds an offset
    in [0, 1), both drawn from torch's random state (a DataLoader worker's own); index and checksum pass through, so
    they still describe the deterministic part. Each call appends ``i`` to ``log``."""

    def __init__(self, log: str, in_place: bool = False) -> None:
        self.log = log
        self.in_place = in_place

    def __call__(self, sample):
        image, i, check = sample
        append_line(self.log, i)
        flip = bool(torch.randint(2, ()).item())
        offset = torch.rand(()).item()
        if self.in_place:
            return image.add_(offset), i, check
        return (image.flip(-1) if flip else image) + offset, i, check


def augmentation_of(sample, i: int) -> tuple[bool, float]:
    """The (flip, offset) that made ``sample`` from sample ``i``'s deterministic part; fails if none did."""
    image, index, check = sample
    base = make_sample(i)[0]
    assert index == i and check == checksum(base), f"sample {i}: index or checksum not the deterministic part's"
    for flip in (False, True):
        diff = image - (base.flip(-1) if flip else base)
        if float(diff.max() - diff.min()) < 1e-5 and -1e-6 <= float(diff.mean()) < 1 + 1e-6:
            return flip, float(diff.mean())
    raise AssertionError(f"sample {i} is no flip-and-offset of its deterministic part")


def make_sample(i: int):
    g = torch.Generator().manual_seed(i)
    image = torch.rand((3, 16, 16), generator=g)
    return image, i, checksum(image)


def checksum(t) -> int:
    return xxhash.xxh3_64_intdigest(raw(t)) >> 2


def check_sample(sample, i: int) -> None:
    image, index, check = sample
    assert index == i and check == checksum(image) and same_tensor(make_sample(i)[0], image), f"sample {i} wrong"


def computations(log: str) -> list[int]:
    try:
        with open(log) as f:
            return sorted(int(line.split()[0]) for line in f)
    except FileNotFoundError:
        return []


@pytest.fixture
def log(tmp_path):
    return str(tmp_path / "computed.log")


def test_cached_dataset_serves_each_sample_from_one_computation(big, log):
    ds = CachedDataset(CountingDataset(6, log), big)
    assert len(ds) == 6
    for _ in range(2):
        for i in range(6):
            check_sample(ds[i], i)
    assert computations(log) == list(range(6)) and big.stats().computations == 6


def test_cached_dataset_key_scheme(big, log):
    inner = CountingDataset(3, log)
    ds = CachedDataset(inner, big)
    assert ds.key_of(1) == (f"{__name__}.CountingDataset", 1)
    assert ds.key_of(np.int64(2)) == ds.key_of(torch.tensor(2)) == ds.key_of(2)  # integers key as Python ints
    assert type(ds.key_of(torch.tensor(2))[1]) is int
    ds[1]
    assert (f"{__name__}.CountingDataset", 1) in big
    other = CachedDataset(inner, big, name="val")
    assert other.key_of(1) == ("val", 1)
    check_sample(other[1], 1)
    assert computations(log) == [1, 1]  # another name, other entries
    custom = CachedDataset(inner, big, key=lambda i: f"sample-{i}")
    check_sample(custom[2], 2)
    assert "sample-2" in big
    with pytest.raises(ValueError):
        CachedDataset(inner, big, key=str, name="x")
    with pytest.raises(TypeError):
        CachedDataset(inner, {})


def test_cached_dataset_pickles_with_the_cache_by_name(big, log):
    ds = CachedDataset(CountingDataset(4, log), big, name="p", ttl=60)
    check_sample(ds[0], 0)
    copy = pickle.loads(pickle.dumps(ds))
    try:
        assert copy.cache is not big and copy.cache.name == big.name and copy.name == "p" and copy.ttl == 60
        check_sample(copy[0], 0)
        check_sample(copy[3], 3)
        assert computations(log) == [0, 3] and big.stats().computations == 2
    finally:
        copy.cache.close()


def test_cached_dataset_transform_applied_after_the_cache_on_hit_and_miss(big, log, tmp_path):
    applied = str(tmp_path / "applied.log")
    inner = CountingDataset(4, log)
    ds = CachedDataset(inner, big, transform=Augment(applied))
    torch.manual_seed(0)
    first, second = ds[1], ds[1]  # a miss, then a hit: both transformed
    assert augmentation_of(first, 1)[1] != augmentation_of(second, 1)[1]
    assert computations(log) == [1] and computations(applied) == [1, 1]
    s = big.stats()
    assert s.computations == 1 and s.puts == 1 and s.hits == 1 and s.misses == 1
    check_sample(big.get(ds.key_of(1)), 1)  # what is stored is the deterministic part, never an augmentation
    plain = CachedDataset(inner, big)  # the transform is no part of the key: the same entries, as they are
    assert plain.key_of(1) == ds.key_of(1) and plain.transform is None
    check_sample(plain[1], 1)
    assert computations(log) == [1] and computations(applied) == [1, 1]
    assert "transform=" in repr(ds) and "transform" not in repr(plain)
    copy = pickle.loads(pickle.dumps(ds))
    try:
        assert type(copy.transform) is Augment and copy.transform.log == applied
        augmentation_of(copy[2], 2)
        assert computations(log) == [1, 2] and computations(applied) == [1, 1, 2]
    finally:
        copy.cache.close()
    with pytest.raises(TypeError, match="transform must be callable"):
        CachedDataset(inner, big, transform="flip")


def test_cached_dataset_in_place_transform_leaves_the_cached_sample(big, log, tmp_path):
    ds = CachedDataset(CountingDataset(2, log), big, transform=Augment(str(tmp_path / "applied.log"), in_place=True))
    torch.manual_seed(0)
    for _ in range(3):  # a miss, then hits: each works on its own copy
        image, _, _ = ds[0]
        assert not same_tensor(make_sample(0)[0], image)
        check_sample(big.get(ds.key_of(0)), 0)
    assert computations(log) == [0]


def test_cached_dataset_without_transform_returns_the_cached_sample(big, log):
    ds = CachedDataset(CountingDataset(3, log), big)
    assert ds.transform is None and repr(ds).endswith(f"name={ds.name!r})")
    for i in range(3):
        check_sample(ds[i], i)
        cached = big.get(ds.key_of(i))
        check_sample(cached, i)
        assert same_tensor(cached[0], ds[i][0])
    assert computations(log) == [0, 1, 2]


def test_cached_dataset_unencodable_sample_says_so(big):
    ds = CachedDataset([object()], big)
    with pytest.raises(TypeError, match="cannot encode"):
        ds[0]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_cached_dataset_dataloader_workers_compute_each_sample_once(big, log, method):
    n = 24
    ds = CachedDataset(CountingDataset(n, log), big, timeout=60)
    loader = DataLoader(ds, batch_size=None, shuffle=True, num_workers=2, multiprocessing_context=method,
                        timeout=120, generator=torch.Generator().manual_seed(1))
    for epoch in range(2):
        seen = []
        for sample in loader:
            i = sample[1]
            check_sample(sample, i)
            seen.append(i)
        assert sorted(seen) == list(range(n))
        assert computations(log) == list(range(n)), f"epoch {epoch}"  # each sample once, across both workers
    s = big.stats()
    assert s.computations == n and s.hits >= n  # the second epoch computed nothing
    assert big.verify(deep=True).ok


@pytest.mark.timeout(120)
def test_cached_dataset_thread_workers_share_one_handle(big, log):
    """Thread-based workers: torch's DataLoader has none (its workers are processes), torchdata.nodes'
    ParallelMapper does (method="thread"). Its threads read through the one handle of their process, each sample
    asked by several threads at once: computed once on the host, every read the right sample, the transform run on
    every read."""
    tn = pytest.importorskip("torchdata.nodes", reason="torchdata is installed by .ci/run next to torch")
    n, repeats = 16, 4
    ds = CachedDataset(CountingDataset(n, log), big, timeout=60, transform=Augment(log + ".aug"))
    for epoch in range(2):
        order = [i for i in torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).tolist()
                 for _ in range(repeats)]  # each index 4 times in a row: 4 threads ask for it together
        node = tn.ParallelMapper(tn.IterableWrapper(order), map_fn=ds.__getitem__, num_workers=4, method="thread")
        seen = []
        for sample in tn.Loader(node):
            i = sample[1]
            augmentation_of(sample, i)  # a flip-and-offset of sample i's one deterministic part
            seen.append(i)
        assert sorted(seen) == sorted(order)
        assert computations(log) == list(range(n)), f"epoch {epoch}"  # each sample once, across the threads
    assert len(computations(log + ".aug")) == 2 * n * repeats  # the random part on every read
    s = big.stats()
    assert (s.computations, s.misses, s.hits) == (n, n, 2 * n * repeats - n)  # waiters are counted as hits


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_cached_dataset_dataloader_epochs_see_new_augmentations_of_one_computation(big, log, tmp_path, method):
    """The deterministic part is computed once per sample on the host, across both workers; the transform runs on
    every read, in the worker, so the second epoch sees other augmentations of the same cached samples. Spawned
    workers persist across epochs, as the recipe has them; forked ones are started again for each."""
    n = 24
    applied = str(tmp_path / "applied.log")
    ds = CachedDataset(CountingDataset(n, log), big, timeout=60, transform=Augment(applied))
    loader = DataLoader(ds, batch_size=None, shuffle=True, num_workers=2, multiprocessing_context=method,
                        persistent_workers=method == "spawn", timeout=120,
                        generator=torch.Generator().manual_seed(1))
    epochs = []
    try:
        for epoch in range(2):
            seen = {}
            for sample in loader:
                i = sample[1]
                assert i not in seen
                seen[i] = augmentation_of(sample, i)
            assert sorted(seen) == list(range(n))
            assert computations(log) == list(range(n)), f"epoch {epoch}"  # each sample once, across both workers
            assert computations(applied) == sorted(list(range(n)) * (epoch + 1)), f"epoch {epoch}"  # every read
            epochs.append(seen)
    finally:
        del loader  # persistent workers exit with it
    first, second = epochs
    assert len({offset for _, offset in first.values()}) == n  # random within an epoch
    assert all(first[i][1] != second[i][1] for i in range(n))  # and a new augmentation of each sample next epoch
    s = big.stats()
    assert s.computations == n and s.puts == n and s.hits >= n  # the second epoch computed and stored nothing
    for i in range(n):
        check_sample(big.get(ds.key_of(i)), i)  # the cache holds the deterministic part only
    assert big.verify(deep=True).ok


def rank_main(cache_name: str, log: str, n: int, rank: int, barrier, results) -> None:
    """One "trainer process" of a node: opens the cache by name, waits for the other rank, reads every sample."""
    cache = SharedCache(cache_name)
    try:
        ds = CachedDataset(CountingDataset(n, log), cache, timeout=60)
        order = range(n) if rank == 0 else [(i * 7) % n for i in range(n)]  # different orders, overlapping
        barrier.wait(60)
        wrong = 0
        for i in order:
            try:
                check_sample(ds[i], i)
            except AssertionError:
                wrong += 1
        results.put((rank, wrong))
    finally:
        cache.close()


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_cached_dataset_shared_by_two_trainer_processes(big, log):
    n = 40
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(big.name, log, n, rank, barrier, results)) for rank in range(2)]
    try:
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    assert got == [(0, 0), (1, 0)]  # every sample each rank read was its own, bit for bit
    assert computations(log) == list(range(n)) and big.stats().computations == n
    check_sample(CachedDataset(CountingDataset(n, log), big)[n - 1], n - 1)  # read from the cache: no computation
    assert computations(log) == list(range(n))


def test_torch_a_dataset_larger_than_the_cache_warns_unless_the_policy_keeps(name, tmp_path):
    log = str(tmp_path / "computed.log")
    with SharedCache(name, capacity_bytes=2**20, max_entries=8, create=True, policy="lru") as c:
        with pytest.warns(UserWarning, match=r"holds at most 8 entries, fewer than the dataset's 16 samples.*"
                                             r"policy='keep'"):
            CachedDataset(CountingDataset(16, log), c)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            CachedDataset(CountingDataset(8, log), c)  # it fits
        c.unlink()
    keep = SharedCache(name, capacity_bytes=2**20, max_entries=8, create=True, policy="keep")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ds = CachedDataset(CountingDataset(16, log), keep)
        order = np.random.default_rng(5)
        for _ in range(3):  # shuffled epochs over twice the cache: from epoch 2 on, half the reads hit
            for i in order.permutation(16).tolist():
                sample = ds[i]
                assert int(sample[1]) == i
        s = keep.stats()
        assert (s.hits, s.misses, s.admitted, s.not_admitted) == (16, 32, 8, 24)
        assert len(computations(log)) == 32  # every miss computed once, the 8 kept never again
    finally:
        keep.close()
        keep.unlink()


def test_torch_a_cache_sized_in_bytes_to_half_the_dataset_warns_once_unless_the_policy_keeps(name, tmp_path):
    """Sized the README's way, by capacity_bytes (max_entries leaves room): the warning comes from the bytes of the
    samples read, extrapolated, and says the numbers and the remedy."""
    log = str(tmp_path / "computed.log")
    n, sample = 64, 1 + 3 * 16 * 16 * 4 + 1 + 1  # a sample's payload: the tuple, the image, the index, the checksum
    with SharedCache(name, capacity_bytes=n * sample // 2, max_entries=1024, create=True, policy="lru") as c:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ds = CachedDataset(CountingDataset(n, log), c, name="half")  # max_entries holds every sample
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for epoch in range(2):
                for i in np.random.default_rng(epoch).permutation(n).tolist():
                    check_sample(ds[i], i)
        said = [str(w.message) for w in caught if issubclass(w.category, CapacityWarning)]
        assert len(said) == 1, said
        assert said[0].startswith(f"CachedDataset 'half': its 64 samples need at least {n * sample:,} bytes "
                                  f"({sample:,} per sample, the mean of the 8 seen so far), more than the "
                                  f"{n * sample // 2:,} the cache {name!r} holds (max_retained_bytes)")
        assert "policy='keep'" in said[0] and f"capacity_bytes of at least {n * sample:,}" in said[0]
        c.unlink()
    with SharedCache(name, capacity_bytes=n * sample // 2, max_entries=1024, create=True, policy="keep") as keep:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                ds = CachedDataset(CountingDataset(n, log), keep, name="half")
                for i in range(n):
                    check_sample(ds[i], i)
        finally:
            keep.unlink()


def test_torch_a_sample_too_large_for_the_cache_is_returned_and_said_once(name, tmp_path):
    log = str(tmp_path / "computed.log")
    with SharedCache(name, capacity_bytes=2048, max_entries=64, create=True) as c:  # a sample is over 3 KiB
        ds = CachedDataset(CountingDataset(4, log), c, name="huge")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                for i in range(4):
                    check_sample(ds[i], i)
        said = [str(w.message) for w in caught if issubclass(w.category, TooLargeWarning)]
        assert len(said) == 1, said
        assert said[0].startswith("CachedDataset 'huge': a value of ")
        assert f"can never be kept in cache {name!r}, whose capacity_bytes is 2,048 bytes" in said[0]
        assert len(computations(log)) == 12  # computed on every read: nothing could be kept
        s = c.stats()
        assert (s.too_large, s.entries) == (12, 0)


def test_torch_dataloader_workers_but_the_first_leave_the_judgement_to_it(name, tmp_path, monkeypatch):
    """Every worker would see the same shortfall: only worker 0 (or the main process) judges and says it."""
    import shmcache.contrib.torch as contrib

    log = str(tmp_path / "computed.log")
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=1024, create=True, policy="lru") as c:
        ds = CachedDataset(CountingDataset(512, log), c)  # 512 samples of 3 KiB: six times the cache
        for worker, says in ((1, 0), (0, 1)):
            monkeypatch.setattr(contrib, "get_worker_info", lambda: type("Info", (), {"id": worker})())
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for i in range(16):
                    check_sample(ds[i], i)
            assert len([w for w in caught if issubclass(w.category, CapacityWarning)]) == says


# A trainer, run twice by the test below: it opens the cache restoring from the snapshot, reads every sample through
# DataLoader workers (checking each), snapshots the cache, says so, and then, when told to, trains on until killed.
TRAINER = textwrap.dedent("""
    import sys, time
    import torch
    from torch.utils.data import DataLoader
    from shmcache import SharedCache
    from shmcache.contrib.torch import CachedDataset
    from tests.test_torch import CountingDataset, check_sample

    name, log, snap, n, then = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    cache = SharedCache(name, capacity_bytes=4 * 2**20, max_entries=256, policy="keep", restore_from=snap)
    restored = cache.restored.restored if cache.restored is not None else 0
    ds = CachedDataset(CountingDataset(n, log), cache, timeout=60)
    loader = DataLoader(ds, batch_size=None, shuffle=True, num_workers=2, multiprocessing_context="fork",
                        timeout=120, generator=torch.Generator().manual_seed(len(then)))
    seen = []
    for sample in loader:
        check_sample(sample, sample[1])
        seen.append(sample[1])
    assert sorted(seen) == list(range(n)), seen
    cache.snapshot(snap)
    print("restored", restored, "computed", cache.stats().computations, flush=True)
    if then == "train-on":
        while True:  # the next epochs, until the job is killed
            for sample in loader:
                check_sample(sample, sample[1])
    cache.close()
""")


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_torch_a_trainer_killed_and_restarted_on_an_empty_shm_restores_without_computing(name, log, tmp_path):
    """The recipe of docs/usage.md, "Snapshot and restore": a trainer snapshots its cache each epoch and is SIGKILLed
    (its DataLoader workers too) while it trains on; /dev/shm is emptied, as on a fresh node; the restarted trainer,
    opening the cache with restore_from, reads every sample again without computing one."""
    n, snap = 32, str(tmp_path / "samples.snap")
    env = {**os.environ, "PYTHONPATH": REPO}
    first = subprocess.Popen([sys.executable, "-c", TRAINER, name, log, snap, str(n), "train-on"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    try:
        line = first.stdout.readline()  # once the first epoch is read and snapshotted
        assert line.split() == ["restored", "0", "computed", str(n)], line + first.stderr.read()
        os.killpg(first.pid, signal.SIGKILL)  # the trainer and its workers, mid-epoch
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
        first.stdout.close()
        first.stderr.close()
    assert computations(log) == list(range(n))
    SharedCache.unlink_name(name)  # the fresh node's empty /dev/shm
    assert not os.path.exists(f"/dev/shm/shmcache.{name}")
    again = subprocess.run([sys.executable, "-c", TRAINER, name, log, snap, str(n), "stop"], capture_output=True,
                           text=True, timeout=180, env=env)  # the name fixture removes the cache it made
    assert again.returncode == 0, again.stderr
    assert again.stdout.split() == ["restored", str(n), "computed", "0"], again.stdout + again.stderr
    assert computations(log) == list(range(n))  # not one sample computed again
