// Embedding kernels for pshybrid, loaded by pshybrid/cuda.py with
// cupy.RawModule(code=..., name_expressions=[...]). Each has an xp twin in pshybrid/kernels.py
// (gather_ref, scatter_add_ref): its test oracle.
//
// gather_rows<V>:      out[i, :] = rows[index[i], :]          rows (N, W), index (n,), out (n, W)
// scatter_add_rows<V>: out[index[i], :] += values[i, :]       values (n, W), out (n_out, W), zeroed
//                                                               by the caller; duplicates summed
// V is the element type of one load/store: float or double (scalar path, any dim), or the
// 16-byte float4 / double2 (vector path: the caller uses it when the row width in bytes is a
// multiple of 16 and every pointer is 16-byte aligned; W is then dim / 4 or dim / 2).
//
// Thread layout: a 2-D block of (lanes, rows_per_block) = (blockDim.x, blockDim.y) threads;
// blockDim.x (a power of two <= 32, ~ the row width in V) lanes walk one row's columns, so a
// warp reads whole rows (coalesced within each row) and no index is divided; blocks stride over
// the rows (grid-stride loop), so any n fits a bounded grid.
//
// Scatter-add uses atomics, not a sorted segment reduction: one pass, no sort, no temporary
// buffers. Training calls it on the inverse index of the batch's deduplicated ids
// (pshybrid/modes.py, Mode._update_device), where a hot id repeats at most ~B times. Cost:
// float sums are order-dependent (not bit-reproducible run to run; exact for integer-valued
// data), fine for training and within 1e-9 relative in float64 in the tests.
// float4 atomics (one 16-byte red.v4.f32 instead of four) are used on sm_90+ with CUDA >= 12.4;
// elsewhere each component is added with a scalar atomicAdd (double: native since sm_60).
//
// An index outside [0, N) (or [0, n_out)) is not checked by the host code: gather writes a
// zero row and scatter-add drops the row, so a bad id never reads or writes out of bounds.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define PSHYBRID_FLOAT4_ATOMICS 1
#endif

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(float4* p, float4 v) {
#ifdef PSHYBRID_FLOAT4_ATOMICS
    atomicAdd(p, v);
#else
    atomicAdd(&p->x, v.x); atomicAdd(&p->y, v.y); atomicAdd(&p->z, v.z); atomicAdd(&p->w, v.w);
#endif
}
__device__ __forceinline__ void atomic_add(double2* p, double2 v) {
    atomicAdd(&p->x, v.x); atomicAdd(&p->y, v.y);
}

template <typename V>
__global__ void gather_rows(const V* __restrict__ rows, const long long* __restrict__ index,
                            V* __restrict__ out, long long n, long long width, long long n_rows) {
    const long long stride = (long long)gridDim.x * blockDim.y;
    for (long long i = (long long)blockIdx.x * blockDim.y + threadIdx.y; i < n; i += stride) {
        const long long r = index[i];
        V* dst = out + i * width;
        if ((unsigned long long)r < (unsigned long long)n_rows) {
            const V* src = rows + r * width;
            for (long long c = threadIdx.x; c < width; c += blockDim.x) dst[c] = src[c];
        } else {
            for (long long c = threadIdx.x; c < width; c += blockDim.x) dst[c] = V{};
        }
    }
}

template <typename V>
__global__ void scatter_add_rows(const long long* __restrict__ index,
                                 const V* __restrict__ values, V* __restrict__ out, long long n,
                                 long long width, long long n_out) {
    const long long stride = (long long)gridDim.x * blockDim.y;
    for (long long i = (long long)blockIdx.x * blockDim.y + threadIdx.y; i < n; i += stride) {
        const long long r = index[i];
        if ((unsigned long long)r >= (unsigned long long)n_out) continue;
        V* dst = out + r * width;
        const V* src = values + i * width;
        for (long long c = threadIdx.x; c < width; c += blockDim.x) atomic_add(dst + c, src[c]);
    }
}

// Explicit instantiations, so that nvcc (.ci/run) compiles every kernel pshybrid/cuda.py
// names; RawModule instantiates the same ones from its name_expressions.
#define PSHYBRID_INSTANTIATE(V)                                                               \
    template __global__ void gather_rows<V>(const V*, const long long*, V*, long long,        \
                                            long long, long long);                            \
    template __global__ void scatter_add_rows<V>(const long long*, const V*, V*, long long,   \
                                                 long long, long long);
PSHYBRID_INSTANTIATE(float)
PSHYBRID_INSTANTIATE(double)
PSHYBRID_INSTANTIATE(float4)
PSHYBRID_INSTANTIATE(double2)
