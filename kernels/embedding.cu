// Embedding kernels for pshybrid, loaded with cupy.RawModule(code=..., name_expressions=[...]).
// Each kernel has an xp twin in pshybrid/kernels.py (gather_ref, scatter_add_ref): its oracle.
//
// gather_rows<T>:      out[i, :] = rows[index[i], :]              one block-row per output row
// scatter_add_rows<T>: out[index[i], :] += values[i, :]           atomicAdd (duplicates summed)
//
// Choice for scatter-add: atomics. The store deduplicates ids before a push (sorted segment sum
// on the host side), so on the GPU the common case is few collisions and atomics are cheapest;
// results are order-dependent in float32 (documented), exact for integer-valued data.

template <typename T>
__global__ void gather_rows(const T* __restrict__ rows, const long long* __restrict__ index,
                            T* __restrict__ out, long long n, long long dim) {
    for (long long i = blockIdx.x; i < n; i += gridDim.x) {
        const T* src = rows + index[i] * dim;
        T* dst = out + i * dim;
        for (long long c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = src[c];
    }
}

template <typename T>
__global__ void scatter_add_rows(const long long* __restrict__ index, const T* __restrict__ values,
                                 T* __restrict__ out, long long n, long long dim) {
    for (long long i = blockIdx.x; i < n; i += gridDim.x) {
        T* dst = out + index[i] * dim;
        const T* src = values + i * dim;
        for (long long c = threadIdx.x; c < dim; c += blockDim.x) atomicAdd(dst + c, src[c]);
    }
}

// Explicit instantiations so nvcc checks both types (RawModule uses name_expressions).
template __global__ void gather_rows<float>(const float*, const long long*, float*, long long, long long);
template __global__ void gather_rows<double>(const double*, const long long*, double*, long long, long long);
template __global__ void scatter_add_rows<float>(const long long*, const float*, float*, long long, long long);
template __global__ void scatter_add_rows<double>(const long long*, const double*, double*, long long, long long);
