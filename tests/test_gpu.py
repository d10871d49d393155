"""The GPU path (docs/gpu.md). Oracles: each CUDA kernel == its NumPy twin
(``kernels.gather_ref`` / ``scatter_add_ref``), CuPy layers, models and optimizers == NumPy on
one step, and training with ``--device cuda`` == the NumPy run (float64, 1e-9 relative).

Tests that need a CUDA device skip where none is visible and FAIL instead when
``PSHYBRID_REQUIRE_GPU=1`` (``bench/gpu_check.py`` sets it), so a GPU machine never
passes by skipping. The packaging and compile tests need no device and run everywhere.
"""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mpi_util import assert_all
from pshybrid import backend, cuda
from pshybrid.backend import cupy_status
from pshybrid.config import TrainConfig
from pshybrid.errors import ConfigError, PshybridError
from pshybrid.kernels import gather_ref, scatter_add_ref
from pshybrid.synthetic import SyntheticCTR

ROOT = Path(__file__).resolve().parent.parent
DATA = SyntheticCTR(seed=5, n_dense=3, cardinalities=(7, 30, 200, 5), zipf=1.3)
BASE = TrainConfig(model="wdl", embedding_dim=4, mlp=(8, 6), steps=3, batch_size=8,
                   dtype="float64", lr=0.2, dense_lr=0.05, seed=3, log_every=1000,
                   cross_layers=2, sparse_optimizer="adagrad", dense_optimizer="adam")


def _gpu_or_skip():
    """cupy, where a CUDA device is usable; else skip (saying what failed), or fail with
    PSHYBRID_REQUIRE_GPU=1."""
    usable, why = cupy_status()
    if usable:
        import cupy

        return cupy
    if os.environ.get("PSHYBRID_REQUIRE_GPU") == "1":
        pytest.fail(f"no usable CUDA device: {why}, but PSHYBRID_REQUIRE_GPU=1")
    pytest.skip(f"no usable CUDA device: {why}")


@pytest.fixture
def cp():
    return _gpu_or_skip()


def _mpi():
    """mpi4py's MPI, imported here and not at module level: the kernel and model tests of
    this file run on a GPU machine whose MPI does not load (bench/gpu_check.py reports that
    in its own line); the tests that train skip there."""
    try:
        from mpi4py import MPI
    except Exception as e:  # noqa: BLE001 - ImportError, or libmpi missing (RuntimeError)
        pytest.skip(f"MPI does not load: {type(e).__name__}: {e}")
    return MPI


def _train():
    _mpi()
    from pshybrid.train import train

    return train


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def run(cfg, comm=None, **kw):
    comm = comm if comm is not None else _mpi().COMM_SELF
    return _train()(cfg, comm, dataset=kw.pop("dataset", DATA), collect=True, out=io.StringIO(),
                 **kw)


# -- no device needed: kernel plumbing, packaging, compilers --------------------------------
def test_kernel_names_cover_every_dtype_and_width():
    want = {("gather_rows", "float32", False): "gather_rows<float>",
            ("gather_rows", "float32", True): "gather_rows<float4>",
            ("gather_rows", "float64", False): "gather_rows<double>",
            ("gather_rows", "float64", True): "gather_rows<double2>",
            ("scatter_add_rows", "float32", False): "scatter_add_rows<float>",
            ("scatter_add_rows", "float32", True): "scatter_add_rows<float4>",
            ("scatter_add_rows", "float64", False): "scatter_add_rows<double>",
            ("scatter_add_rows", "float64", True): "scatter_add_rows<double2>"}
    for (op, dt, vec), name in want.items():
        assert cuda.kernel_name(op, np.dtype(dt), vec) == name
    fused = [f"{k}<{t}>" for k in ("bce_logits", "sgd_update", "adagrad_update", "adam_update",
                                   "bias_act", "relu_grad")
             for t in ("float", "double")]  # kernels/fused.cu: scalar types only
    assert sorted(cuda.NAME_EXPRESSIONS) == sorted([*want.values(), *fused])
    # a vector is 16 bytes: 4 float32 or 2 float64 per load
    assert {str(k): v[2] * k.itemsize for k, v in cuda.CTYPES.items()} == \
        {"float32": 16, "float64": 16}
    with pytest.raises(PshybridError, match="float32 and float64"):
        cuda.kernel_name("gather_rows", np.int32, False)
    source = cuda.source()
    for name in cuda.NAME_EXPRESSIONS:  # every name is a template the source instantiates
        kernel, t = name[:-1].split("<")
        macro = "PSHYBRID_INSTANTIATE_FUSED" if kernel in cuda.FUSED else "PSHYBRID_INSTANTIATE"
        assert f"__global__ void {kernel}(" in source and f"{macro}({t})" in source


def test_source_checkout_kernels_are_found():
    assert cuda.source_files() == sorted((ROOT / "kernels").glob("*.cu"))
    assert "gather_rows" in cuda.source() and "scatter_add_rows" in cuda.source()


@pytest.mark.timeout(360)  # (its subprocess's own 300 s, not the suite's 120 s)
def test_installed_package_ships_the_kernels(tmp_path):
    """``pip install .`` (not editable) into a fresh venv installs share/pshybrid/kernels/*.cu,
    and pshybrid.cuda imported from that install finds them there (not in a checkout)."""
    src = tmp_path / "src"
    src.mkdir()
    for f in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / f, src / f)
    for d in ("pshybrid", "kernels"):
        shutil.copytree(ROOT / d, src / d, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    pip = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(src)],
                         capture_output=True, text=True, timeout=300)
    if pip.returncode and "No matching distribution" in pip.stdout + pip.stderr:
        pytest.skip("cannot fetch the build backend (offline?): " + pip.stderr[-300:])
    assert pip.returncode == 0, pip.stdout + pip.stderr
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    # the test environment's packages (numpy, ...) after the fresh install, which comes first
    Path(site, "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = ("import json, pshybrid, pshybrid.cuda as c; print(json.dumps([pshybrid.__file__, "
             "[str(p) for p in c.source_files()], c.source()]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    where, files, text = json.loads(out.stdout)
    assert Path(where).resolve().is_relative_to(venv.resolve()), where
    assert [Path(f).name for f in files] == [p.name for p in cuda.source_files()]
    assert all(Path(f).resolve().parent == (venv / "share/pshybrid/kernels").resolve()
               for f in files), files
    assert text == cuda.source()


@pytest.mark.timeout(360)  # (its subprocess's own 300 s, not the suite's 120 s)
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_nvcc_compiles_the_kernels():
    """What .ci/run does: every .cu for sm_90 and sm_80 (no device needed)."""
    for cu in cuda.source_files():
        p = subprocess.run(["nvcc", "-c", "-o", os.devnull, "-gencode",
                            "arch=compute_90,code=sm_90", "-gencode",
                            "arch=compute_80,code=sm_80", str(cu)],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
        return nvrtc
    except Exception:  # noqa: BLE001 - cupy or libnvrtc missing
        return None


# What cupy.RawModule(code, options, name_expressions) adds to our options before NVRTC
# (CuPy 13-14, cupy/cuda/compiler.py: _compile_with_cache_cuda, _compile_using_nvrtc):
# flush denormals, "-arch=sm_XX" (a cubin; compute_XX past NVRTC's newest arch) and device
# code by default; NVRTC >= 12.8 also gets --pch (precompiled headers: no effect on code).
CUPY_NVRTC_OPTIONS = ("-ftz=true", "--device-as-default-execution-space")


@pytest.mark.skipif(_nvrtc() is None and os.environ.get("PSHYBRID_REQUIRE_NVRTC") != "1",
                    reason="cupy's NVRTC (libnvrtc) not available")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_every_name_expression_without_spills(arch):
    """What ``cupy.RawModule(code, options, name_expressions)`` does on a device, minus the
    device: NVRTC compiles the module with CuPy's own options to a cubin for ``arch``,
    lowers every kernel name the module maps to, and ptxas reports no register spills (a
    spill would put every row's loop through local memory). CI installs NVRTC and sets
    PSHYBRID_REQUIRE_NVRTC=1, so there this test cannot pass by skipping."""
    nvrtc = _nvrtc()
    assert nvrtc is not None, "PSHYBRID_REQUIRE_NVRTC=1 but cupy's NVRTC does not load"
    prog = nvrtc.createProgram(cuda.source(), "pshybrid.cu", [], [])
    try:
        for name in cuda.NAME_EXPRESSIONS:
            nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, [*cuda.OPTIONS, *CUPY_NVRTC_OPTIONS, f"-arch={arch}",
                                        "-Xptxas=-v"])
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"NVRTC: {e}\n{nvrtc.getProgramLog(prog)}")
        lowered = {nvrtc.getLoweredName(prog, name) for name in cuda.NAME_EXPRESSIONS}
        assert len(lowered) == len(cuda.NAME_EXPRESSIONS) and all(n.startswith("_Z")
                                                                   for n in lowered)
        log = nvrtc.getProgramLog(prog)
        entries = re.findall(r"Compiling entry function '(\w+)' for '(\w+)'", log)
        assert {e for e, _ in entries} == lowered and {a for _, a in entries} == {arch}, log
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        assert len(spills) == len(lowered) and all(a == b == "0" for a, b in spills), log
        assert nvrtc.getCUBIN(prog)[:4] == b"\x7fELF"
    finally:
        nvrtc.destroyProgram(prog)


class _FakeRuntimeError(Exception):
    pass


@pytest.mark.parametrize("case,want", [
    ("missing", "cupy is not installed"),
    ("driver", "NVIDIA driver is older than CuPy's CUDA runtime"),
    ("nodriver", "no NVIDIA driver on this machine (no /proc/driver/nvidia/version)"),
    ("nodevice", "no CUDA device visible (CUDARuntimeError: cudaErrorNoDevice"),
    ("zero", "no CUDA device visible (device count 0); CUDA_VISIBLE_DEVICES=''"),
    ("other", "the CUDA runtime failed: CUDARuntimeError: cudaErrorUnknown"),
    ("ok", "2 CUDA device(s), CuPy 99.0")])
def test_cupy_status_says_what_failed(monkeypatch, case, want):
    """``cupy_status`` (and ``--device cuda``'s error) names the failure: a missing cupy, a
    driver older than CuPy's CUDA runtime, no driver at all (CUDA calls both insufficient), no device (with CUDA_VISIBLE_DEVICES), any other
    runtime error; a fake cupy module stands in for each."""
    import types

    from pshybrid.backend import cupy_available
    from pshybrid.devices import pick_device

    insufficient = ("cudaErrorInsufficientDriver: CUDA driver version is insufficient for "
                    "CUDA runtime version")
    monkeypatch.setattr(backend, "nvidia_driver_loaded", lambda: case != "nodriver")
    errors = {"driver": insufficient, "nodriver": insufficient, "nodevice": "cudaErrorNoDevice: no "
                        "CUDA-capable device is detected", "other": "cudaErrorUnknown: oops"}
    err = type("CUDARuntimeError", (_FakeRuntimeError,), {})

    def count():
        if case in errors:
            raise err(errors[case])
        return 0 if case == "zero" else 2

    fake = types.SimpleNamespace(__version__="99.0", cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=count)))
    monkeypatch.setitem(sys.modules, "cupy", None if case == "missing" else fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    usable, why = cupy_status()
    assert usable == (case == "ok") == cupy_available() and want in why, why
    if case != "ok":
        with pytest.raises(ConfigError, match="no usable CUDA device: ") as e:
            pick_device("cuda", 0)
        assert why in str(e.value)
    else:
        assert pick_device("cuda", 3) == "cuda:1"


def test_device_cuda_without_gpu_is_one_clear_error():
    usable, why = cupy_status()
    if usable:
        pytest.skip("a CUDA device is visible")
    with pytest.raises(ConfigError, match="no usable CUDA device: ") as err:
        run(replace(BASE, device="cuda", mode="allreduce"))
    assert why in str(err.value)  # what failed, not only that something did


@pytest.mark.parametrize("setting,want", [
    ("on", "yes (--cuda-aware on); --device cuda's dense Allreduce: blocking, on device buffers"),
    ("off", "no (--cuda-aware off); --device cuda's dense Iallreduce: staged through pinned "
            "host memory"),
    ("auto", "(MPIX_Query_cuda_support() in libmpi")])
def test_info_shows_the_dense_allreduce_path(setting, want):
    """``pshybrid info`` says which path GPU workers' dense Allreduce takes: a blocking
    Allreduce on device buffers (CUDA-aware MPI) or an Iallreduce staged through pinned host
    memory; ``auto`` asks the loaded MPI library (the mpich wheel: not CUDA-aware)."""
    _mpi()
    p = subprocess.run([sys.executable, "-m", "pshybrid", "info", "--cuda-aware", setting],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("CUDA-aware MPI"))
    assert want in line, line
    if setting == "auto":
        from pshybrid.devices import cuda_aware_mpi

        aware = cuda_aware_mpi()[0]
        assert ("blocking, on device buffers" if aware else "staged through pinned") in line


def test_cuda_awareness_is_asked_of_the_library_mpi4py_loaded():
    """``devices._loaded_mpi`` finds the MPI library this process mapped, by its path (Cray
    MPICH's libmpi_cray.so.12 has none of the usual names: auto then said 'no
    MPIX_Query_cuda_support' and staged on a CUDA-aware MPI); each is already loaded."""
    import ctypes

    _mpi()
    from mpi4py import MPI  # noqa: F401

    from pshybrid.devices import _loaded_mpi

    libs = _loaded_mpi()
    assert libs and all(os.path.basename(p).startswith("libmpi") for p in libs), libs
    for p in libs:
        ctypes.CDLL(p, mode=os.RTLD_NOLOAD)  # (OSError if it were not mapped)


# -- kernels vs their twins -----------------------------------------------------------------
DTYPES = ["float32", "float64"]
DIMS = [1, 2, 3, 4, 5, 8, 17, 64, 130]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", DIMS)
def test_gather_equals_twin(cp, dtype, dim):
    rng = np.random.default_rng(dim)
    rows = rng.standard_normal((97, dim)).astype(dtype)
    for index in (rng.integers(0, 97, 1000), rng.integers(0, 97, (33, 7)), np.zeros(0, np.int64),
                  np.full(50, 96), np.arange(97)[::-1]):
        want = gather_ref(rows, index)
        got = cuda.gather(cp.asarray(rows), cp.asarray(index))
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got.get(), want)  # a copy: bit for bit
        np.testing.assert_array_equal(cuda.gather(cp.asarray(rows), index).get(), want)  # host ids
    # a base pointer off the 16-byte grid must take the scalar path, still exact
    flat = cp.asarray(rng.standard_normal(97 * dim + 1).astype(dtype))
    view = flat[1:].reshape(97, dim)
    idx = rng.integers(0, 97, 300)
    np.testing.assert_array_equal(cuda.gather(view, cp.asarray(idx)).get(),
                                  gather_ref(view.get(), idx))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", DIMS)
def test_scatter_add_equals_twin(cp, dtype, dim):
    rng = np.random.default_rng(100 + dim)
    n = 40
    hot = np.concatenate([rng.integers(0, n, 700), np.full(300, 7), np.zeros(0, np.int64)])
    rng.shuffle(hot)
    for index in (hot, rng.permutation(n), np.zeros(0, np.int64), np.full(5, n - 1)):
        ints = rng.integers(-8, 9, (index.size, dim)).astype(dtype)  # exact in any order
        got = cuda.scatter_add(cp.asarray(index), cp.asarray(ints), n)
        assert got.shape == (n, dim) and got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got.get(), scatter_add_ref(index, ints, n))
        vals = rng.standard_normal((index.size, dim)).astype(dtype)
        want = scatter_add_ref(index, vals, n)
        got = cuda.scatter_add(index, cp.asarray(vals), n).get()  # host ids
        tol = 1e-12 if dtype == "float64" else 1e-4  # atomics: summation order not fixed
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    view = cp.asarray(rng.integers(-8, 9, 300 * dim + 1).astype(dtype))[1:].reshape(300, dim)
    idx = rng.integers(0, n, 300)
    np.testing.assert_array_equal(cuda.scatter_add(cp.asarray(idx), view, n).get(),
                                  scatter_add_ref(idx, view.get(), n))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 3, 8, 130])
def test_kernels_grid_stride_and_bad_ids(cp, monkeypatch, dtype, dim):
    """A grid far smaller than the rows (as for an index past 32 blocks per SM: here 32
    blocks for 20000 rows), so every thread loops; ids outside [0, N) gather a zero row and
    are dropped by scatter-add (never read or written out of bounds)."""
    mod = cuda._module()[0]
    monkeypatch.setattr(cuda, "_module", lambda: (mod, 1))  # "one SM": grid of 32 blocks
    rng = np.random.default_rng(200 + dim)
    N = 500
    rows = rng.standard_normal((N, dim)).astype(dtype)
    idx = rng.integers(0, N, 20000)
    idx[rng.choice(idx.size, 40, replace=False)] = np.repeat([-1, N, 1 << 40, -(1 << 62)], 10)
    ok = (idx >= 0) & (idx < N)
    want = np.where(ok[:, None], rows[np.where(ok, idx, 0)], 0).astype(dtype)
    np.testing.assert_array_equal(cuda.gather(cp.asarray(rows), cp.asarray(idx)).get(), want)
    vals = rng.integers(-8, 9, (idx.size, dim)).astype(dtype)  # exact in any order
    np.testing.assert_array_equal(cuda.scatter_add(cp.asarray(idx), cp.asarray(vals), N).get(),
                                  scatter_add_ref(idx[ok], vals[ok], N))


def test_kernels_offsets_past_2_31_elements(cp):
    """row * dim past 2**31 elements (64-bit offsets): the first and last rows of a float32
    table of N * 17 > 2**31 elements (scalar path), gathered and scatter-added."""
    dim = 17
    N = (1 << 31) // dim + 4
    nbytes = N * dim * 4
    if cp.cuda.runtime.memGetInfo()[0] < 2 * nbytes + (1 << 30):
        pytest.skip(f"needs {(2 * nbytes >> 30) + 1} GiB of free GPU memory")
    pick = np.array([N - 1, 0, N - 4, N - 2, 1, N - 3])
    known = np.arange(1, pick.size * dim + 1, dtype=np.float32).reshape(pick.size, dim)
    table = cp.empty((N, dim), cp.float32)
    table[cp.asarray(pick)] = cp.asarray(known)
    idx = np.array([0, 3, 5, 1, 2, 4, 0])
    try:
        np.testing.assert_array_equal(cuda.gather(table, cp.asarray(pick[idx])).get(),
                                      known[idx])
        del table
        out = cuda.scatter_add(cp.asarray(pick[idx]), cp.asarray(known[idx]), N)
        np.testing.assert_array_equal(out[cp.asarray(pick)].get(),
                                      known * np.bincount(idx, minlength=pick.size)[:, None])
        assert int(cp.count_nonzero(out)) == pick.size * dim  # nothing written elsewhere
        del out
    finally:
        cp.get_default_memory_pool().free_all_blocks()


def test_kernels_module_dispatches_cupy_arrays(cp):
    from pshybrid import kernels

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((50, 6))
    idx = rng.integers(0, 50, (20, 3))
    got = kernels.gather(cp.asarray(rows), cp.asarray(idx))
    assert isinstance(got, cp.ndarray)
    np.testing.assert_array_equal(got.get(), gather_ref(rows, idx))
    vals = rng.standard_normal((60, 6))
    got = kernels.scatter_add(cp.asarray(idx.ravel()), cp.asarray(vals), 50)
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(got.get(), scatter_add_ref(idx.ravel(), vals, 50), rtol=1e-12,
                               atol=1e-12)


# -- layers, models, optimizers: CuPy == NumPy on one step -------------------------------
@pytest.mark.parametrize("model_name", ["wdl", "deepfm", "dcn", "dcnv2", "dlrm"])
def test_model_forward_backward_cupy_equals_numpy(cp, model_name):
    from pshybrid.layers import ParamSpace, bce_with_logits
    from pshybrid.models import build_model

    B, res = 16, {}
    for xp in (np, cp):
        params = ParamSpace()
        model, sparse = build_model(model_name, DATA.schema, 4, (8, 6), params, "float64", 2)
        params.build(xp, np.dtype("float64"), seed=7)
        r = np.random.default_rng(1)
        dense = xp.asarray(r.standard_normal((B, DATA.schema.n_dense)))
        emb = xp.asarray(r.standard_normal((B, len(DATA.schema.cardinalities), sparse.table.dim)))
        label = xp.asarray((r.random(B) < 0.3).astype(np.float64))
        logits = model.forward(dense, emb)
        loss, dz = bce_with_logits(logits, label, 1 / B)  # CuPy: the fused kernel
        params.zero_grad()
        demb = model.backward(dz)
        res[xp.__name__] = [a if xp is np else a.get() for a in (logits, loss, demb, params.flat_grad)]
    for a, b in zip(res["cupy"], res["numpy"]):
        assert a.shape == b.shape
        assert rel_err(a, b) < 1e-12


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("l2", [0.0, 0.01])
def test_optimizer_cupy_equals_numpy(cp, kind, l2):
    """CuPy: ``update`` is the fused kernel (``cuda.dense_update``), ``update_rows`` the
    array expressions; NumPy: the CPU kernels. With L2, values below the flush bound too."""
    from pshybrid.optim import Optimizer

    opt = Optimizer(kind, 0.1, l2=l2)
    rng = np.random.default_rng(2)
    w, g = rng.standard_normal((30, 5)), rng.standard_normal((30, 5))
    w[0, :2], g[0, :2] = 1e-160, 0.0  # flushed to 0 with L2, kept without
    rows, gr = np.array([3, 0, 29, 11]), rng.standard_normal((4, 5))
    out = {}
    for xp in (np, cp):
        W, Wr = xp.asarray(w.copy()), xp.asarray(w.copy())
        S = {k: xp.zeros_like(W) + 0.5 for k in opt.slots}
        Sr = {k: xp.zeros_like(W) + 0.5 for k in opt.slots}
        for step in (1, 2):
            opt.update(W, xp.asarray(g), S, step)
            opt.update_rows(Wr, xp.asarray(rows), xp.asarray(gr), Sr, step)
        host = (lambda a: a) if xp is np else (lambda a: a.get())
        out[xp.__name__] = [host(W), host(Wr)] + [host(a) for a in (*S.values(), *Sr.values())]
    for a, b in zip(out["cupy"], out["numpy"]):
        assert rel_err(a, b) < 1e-12


@pytest.mark.mpi(min_size=2)
def test_iallreduce_of_device_buffers(comm):
    """The transport's dense Allreduce of a CuPy buffer: staged through pinned memory (any
    MPI), and handed to MPI directly when MPI is CUDA-aware. Oracle: sum of rank+1."""
    from pshybrid.devices import cuda_aware_mpi
    from pshybrid.transport import iallreduce

    cp = _gpu_or_skip()
    paths = [False] + ([True] if cuda_aware_mpi()[0] else [])
    ok, msg = True, ""
    for aware in paths:
        for dtype in DTYPES:
            buf = cp.arange(1001, dtype=dtype) * (comm.rank + 1)  # a kernel writes it...
            iallreduce(comm, buf, aware).Wait()                   # ...the transport syncs
            want = np.arange(1001, dtype=dtype) * (comm.size * (comm.size + 1) // 2)
            if not np.array_equal(buf.get(), want):
                ok, msg = False, f"cuda_aware={aware} {dtype}: wrong sum"
    assert_all(comm, ok, msg)


# -- training on the GPU == the NumPy run -------------------------------------------------
@pytest.mark.parametrize("model", ["wdl", "deepfm", "dcn", "dcnv2", "dlrm"])
def test_train_cuda_graphs_on_equal_off_equal_numpy(cp, model):
    """The step as one CUDA graph (``graphs.DeviceStep``) == kernel by kernel == NumPy."""
    cfg = replace(BASE, model=model, mode="allreduce", servers=0, steps=5)
    ref = run(cfg)
    on, off = (run(replace(cfg, device="cuda", cuda_graphs=g)) for g in ("on", "off"))
    assert on.summary["cuda_graphs"] == "on", on.summary["cuda_graphs"]
    for got in (on, off):
        assert rel_err(got.dense, ref.dense) < 1e-9 and rel_err(got.table, ref.table) < 1e-9


TRAIN_CASES = [("wdl", "sgd", "sgd"), ("wdl", "adagrad", "adam"), ("wdl", "adam", "adam"),
               ("deepfm", "adagrad", "adam"), ("dcn", "adagrad", "adam"),
               ("dcnv2", "adagrad", "adam"),
               ("dlrm", "adam", "sgd")]


@pytest.mark.parametrize("model,sparse_opt,dense_opt", TRAIN_CASES)
def test_train_allreduce_mode_cuda_equals_numpy(cp, model, sparse_opt, dense_opt):
    cfg = replace(BASE, model=model, mode="allreduce", servers=0, sparse_optimizer=sparse_opt,
                  dense_optimizer=dense_opt)
    got = run(replace(cfg, device="cuda"))
    ref = run(cfg)
    init = run(replace(cfg, steps=0))
    assert isinstance(got.dense, np.ndarray) and isinstance(got.table, np.ndarray)
    assert rel_err(got.dense, ref.dense) < 1e-9 and rel_err(got.table, ref.table) < 1e-9
    assert rel_err(init.dense, ref.dense) > 1e-4 and rel_err(init.table, ref.table) > 1e-4
    assert abs(got.log[-1]["loss"] - ref.log[-1]["loss"]) < 1e-9 * abs(ref.log[-1]["loss"])


def test_train_cuda_eval_checkpoint_and_resume_equal_numpy(cp, tmp_path):
    """Evaluation (logits back to the host) and checkpoints (dense state device->host, and
    host->device on resume) on a GPU worker give the NumPy run's numbers."""
    from pshybrid.synthetic import write_synthetic

    tf, vf = str(tmp_path / "t.h5"), str(tmp_path / "v.h5")
    write_synthetic(tf, 400, valid_fraction=0.25, valid_out=vf, seed=9, n_dense=3,
                    cardinalities=(7, 30, 200, 5))
    cfg = replace(BASE, mode="allreduce", servers=0, data=tf, eval_data=vf, steps=4,
                  eval_every=2, shuffle=False)
    train, self_comm = _train(), _mpi().COMM_SELF
    ref = train(cfg, self_comm, collect=True, out=io.StringIO())
    ck = str(tmp_path / "ck")
    got = train(replace(cfg, device="cuda", checkpoint_dir=ck, checkpoint_every=2), self_comm,
                collect=True, out=io.StringIO())
    for g, r in zip(got.evals, ref.evals):
        assert g["step"] == r["step"] and abs(g["auc"] - r["auc"]) < 1e-9
        assert abs(g["logloss"] - r["logloss"]) < 1e-9
    assert rel_err(got.dense, ref.dense) < 1e-9 and rel_err(got.table, ref.table) < 1e-9
    resumed = train(replace(cfg, device="cuda", resume=f"{ck}/step-2"), self_comm,
                    collect=True, out=io.StringIO())
    assert rel_err(resumed.dense, ref.dense) < 1e-9 and rel_err(resumed.table, ref.table) < 1e-9


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["hybrid", "ps"])
def test_train_server_modes_cuda_equal_single_process_numpy(comm, mode):
    """GPU workers + CPU servers under BSP == one NumPy process with the global batch."""
    _gpu_or_skip()
    S = 1 if comm.size <= 3 else 2
    W = comm.size - S
    cfg = replace(BASE, mode=mode, servers=S)
    got = run(replace(cfg, device="cuda"), comm)
    ok, msg = True, ""
    if got.role == "worker":
        ref = run(replace(cfg, mode="allreduce", servers=0, batch_size=W * cfg.batch_size),
                  )
        errs = {"dense": rel_err(got.dense, ref.dense), "table": rel_err(got.table, ref.table)}
        if max(errs.values()) > 1e-9:
            ok, msg = False, f"{mode} W={W} S={S} on GPU: relative error {errs} > 1e-9"
    assert_all(comm, ok, msg)


# -- W = 2 GPU workers: over RMA, several Allreduce buckets, float32 ---------------------
def _first(comm, n):
    """A communicator of ``comm``'s first ``n`` ranks (None on the others), collectively."""
    sub = comm.Split(0 if comm.rank < n else 1, comm.rank)
    if comm.rank < n:
        return sub
    sub.Free()
    return None


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["hybrid", "ps", "allreduce"])
def test_train_two_gpu_workers_over_rma_in_buckets_equal_numpy(comm, mode):
    """W = 2 GPU workers (+ 1 CPU server in hybrid and ps) with the rows read over RMA Gets
    (--shared-memory off: the path between nodes) and the dense gradient's Allreduce started
    in several buckets during backward (--bucket-mb 0.001: ~1 KiB buckets; the staged or
    CUDA-aware path between two GPU workers) == one NumPy process with the global batch,
    float64, 1e-9 relative."""
    _gpu_or_skip()
    n = 2 if mode == "allreduce" else 3
    sub = _first(comm, n)
    ok, msg = True, ""
    if sub is not None:
        cfg = replace(BASE, mode=mode, servers=0 if mode == "allreduce" else 1, mlp=(32, 16),
                      steps=4, bucket_mb=0.001, shared_memory="off")
        # the MLP alone: (3 dense + 4 fields x 4) x 32 + 32 x 16 weights = 8960 bytes, so
        # ~8 buckets of >= 1 KiB
        got = run(replace(cfg, device="cuda"), sub)
        if got.role == "worker":
            ref = run(replace(cfg, mode="allreduce", servers=0, batch_size=2 * cfg.batch_size))
            errs = {"dense": rel_err(got.dense, ref.dense),
                    "table": rel_err(got.table, ref.table)}
            if max(errs.values()) > 1e-9:
                ok, msg = False, f"{mode} W=2 on GPU: relative error {errs} > 1e-9"
        sub.Free()
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=3)
def test_train_float32_two_gpu_workers_close_to_numpy(comm):
    """float32: hybrid with W = 2 GPU workers (RMA, buckets) vs the same run on NumPy
    float32 in one process with the global batch. Tolerance: 1e-4 relative to the largest
    parameter after 4 steps (float32 epsilon 1.2e-7; the GPU sums in another order:
    atomics in scatter-add, cuBLAS, the Allreduce of two halves)."""
    _gpu_or_skip()
    sub = _first(comm, 3)
    ok, msg = True, ""
    if sub is not None:
        cfg = replace(BASE, mode="hybrid", servers=1, dtype="float32", mlp=(32, 16), steps=4,
                      bucket_mb=0.001, shared_memory="off")
        got = run(replace(cfg, device="cuda"), sub)
        if got.role == "worker":
            ref = run(replace(cfg, mode="allreduce", servers=0, batch_size=2 * cfg.batch_size))
            init = run(replace(cfg, mode="allreduce", servers=0, steps=0))
            errs = {"dense": rel_err(got.dense, ref.dense),
                    "table": rel_err(got.table, ref.table)}
            moved = rel_err(init.dense, ref.dense)  # the oracle is not the start point
            if max(errs.values()) > 1e-4 or moved < 1e-3 or got.dense.dtype != np.float32:
                ok, msg = False, f"float32 W=2 on GPU: {errs} > 1e-4 (moved {moved})"
        sub.Free()
    assert_all(comm, ok, msg)
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bag_pooling_on_the_gpu_equals_numpy(cp, mode):
    """Multi-hot pooling (``layers.BagPooling``) on CuPy arrays == on NumPy, both ways."""
    from pshybrid.layers import BagPooling

    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 6, (9, 3))
    emb = rng.standard_normal((9 * 2 + int(lengths.sum()), 5))
    dy = rng.standard_normal((9, 5, 5))
    host, dev = BagPooling(2, mode), BagPooling(2, mode)
    np.testing.assert_array_equal(dev.forward(cp.asarray(emb), lengths).get(),
                                  host.forward(emb, lengths))
    np.testing.assert_allclose(dev.backward(cp.asarray(dy)).get(), host.backward(dy),
                               rtol=1e-15, atol=0)


# -- one host wait per training step (docs/gpu.md) -----------------------------------------
def _waits_per_step(cfg, comm):
    """Train ``cfg`` on ``comm``, logging only at the end; -> (role, the host waits each step
    made after the first two (steady state: no log read back, no checkpoint))."""
    from pshybrid.backend import host_waits

    seen = []
    got = _train()(cfg, comm, dataset=DATA, out=io.StringIO(),
                   on_step=lambda done: seen.append(host_waits()))
    if got.role != "worker":
        return got.role, []
    return got.role, np.diff(seen[1:-1]).tolist()  # the last step reads the loss back


@pytest.mark.parametrize("bucket_mb", [0.0, 0.001])
def test_a_gpu_step_waits_on_the_host_once(cp, bucket_mb):
    """allreduce mode on one GPU worker (staged Allreduce, in one or ~8 buckets): every
    steady-state step makes exactly one host wait (``backend.host_waits``)."""
    cfg = replace(BASE, mode="allreduce", servers=0, mlp=(32, 16), steps=6, device="cuda",
                  bucket_mb=bucket_mb, cuda_aware="off")
    _, waits = _waits_per_step(cfg, _mpi().COMM_SELF)
    assert waits == [1, 1, 1], waits


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode,placement", [("hybrid", "dedicated"), ("hybrid", "colocated"),
                                            ("ps", "dedicated"), ("allreduce", "dedicated")])
@pytest.mark.parametrize("sparse_opt", ["adagrad", "sgd"])  # server step, or live pushes
def test_two_gpu_workers_wait_on_the_host_once_per_step(comm, mode, placement, sparse_opt):
    """W = 2 GPU workers (+ 1 CPU server dedicated), dense Allreduce in ~8 buckets, staged
    and (where MPI is CUDA-aware) direct: exactly one host wait per steady-state step."""
    from pshybrid.devices import cuda_aware_mpi

    _gpu_or_skip()
    n = 3 if (mode != "allreduce" and placement == "dedicated") else 2
    sub = _first(comm, n)
    ok, msg = True, ""
    if sub is not None:
        for aware in ["off"] + (["on"] if cuda_aware_mpi()[0] else []):
            cfg = replace(BASE, mode=mode, placement=placement, sparse_optimizer=sparse_opt,
                          dense_optimizer="sgd" if sparse_opt == "sgd" else "adam",
                          servers=1 if n == 3 else None if placement == "colocated" else 0,
                          mlp=(32, 16), steps=6, bucket_mb=0.001, shared_memory="off",
                          device="cuda", cuda_aware=aware)
            role, waits = _waits_per_step(cfg, sub)
            if role == "worker" and waits != [1, 1, 1]:
                ok, msg = False, f"{mode} {placement} cuda-aware {aware}: waits {waits}"
        sub.Free()
    assert_all(comm, ok, msg)
