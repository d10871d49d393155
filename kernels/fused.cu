// Fused elementwise kernels of a GPU worker's step, loaded with embedding.cu by
// pshybrid/cuda.py (one RawModule). Each replaces a chain of array expressions (one kernel
// launch and one pass over memory each) by one launch and one pass; each has a NumPy twin
// that is its test oracle.
//
// bce_logits<T>:      per sample i of n: e = exp(-|z|), s = 1 / (1 + e), sigma = z >= 0 ? s : e*s,
//                     loss[i] = max(z, 0) - z*y + log1p(e), dz[i] = (sigma - y) * scale
//                     (twin: layers.bce_with_logits, the same operations in the same order)
// sgd_update<T>,      the dense optimizer's step over n elements, each element's formula that
// adagrad_update<T>,  of the CPU's fused row kernels (pshybrid/kernels.py, _nb_*_rows: their
// adam_update<T>:     twin, run on the flat buffer as one row); l2 != 0 couples the gradient
//                     (g + l2*w) and flushes every new weight and state value below `tiny` in
//                     magnitude to 0 (Adam's moments always; `tiny` is
//                     Optimizer.flush_bound), as pshybrid/optim.py documents.
//                     The step's scalars (the scheduled rate, Adam's bias corrections) come
//                     as arguments, computed on the host as the CPU kernels get them.
//
// bias_act<T>:       y (rows, d) in place: y[i] = y[i] + b[i % d], then times (y[i] > 0) if
//                     relu (a Linear layer's bias and ReLU after its GEMM; twin: x @ W + b,
//                     then y * (y > 0): layers.Linear on NumPy). A product, as the twin's,
//                     not a select: a NaN or -inf stays NaN, so a diverging run is seen.
// relu_grad<T>:       dx[i] = dy[i] * (y[i] > 0), y the ReLU's output (twin: the same)
//
// Layout: 1-D blocks, a grid-stride loop over the n elements (the grid is bounded by the
// caller: any n fits).

template <typename T> __device__ __forceinline__ T flush(T x, T tiny) {
    return (x < tiny && x > -tiny) ? T(0) : x;
}

template <typename T>
__global__ void bce_logits(const T* __restrict__ z, const T* __restrict__ y,
                           T* __restrict__ loss, T* __restrict__ dz, T scale, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T zi = z[i], yi = y[i];
        const T e = exp(-fabs(zi));
        const T s = T(1) / (T(1) + e);
        const T sigma = zi >= T(0) ? s : e * s;
        loss[i] = (zi > T(0) ? zi : T(0)) - zi * yi + log1p(e);
        dz[i] = (sigma - yi) * scale;
    }
}

template <typename T>
__global__ void sgd_update(T* __restrict__ w, const T* __restrict__ g, long long n, T lr,
                           T l2, T tiny) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (l2 != T(0)) {
            const T x = g[i] + l2 * w[i];
            w[i] = flush(w[i] - lr * x, tiny);
        } else {
            w[i] = w[i] - lr * g[i];
        }
    }
}

template <typename T>
__global__ void adagrad_update(T* __restrict__ w, const T* __restrict__ g, T* __restrict__ acc,
                               long long n, T lr, T eps, T l2, T tiny) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T x = l2 != T(0) ? g[i] + l2 * w[i] : g[i];
        T a = acc[i] + x * x;
        T nw = w[i] - lr * x / (sqrt(a) + eps);
        if (l2 != T(0)) {
            a = flush(a, tiny);
            nw = flush(nw, tiny);
        }
        acc[i] = a;
        w[i] = nw;
    }
}

template <typename T>
__global__ void adam_update(T* __restrict__ w, const T* __restrict__ g, T* __restrict__ m,
                            T* __restrict__ v, long long n, T b1, T one_b1, T b2, T one_b2,
                            T inv_sqrt_c2, T eps, T lr_c1, T l2, T tiny) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T x = l2 != T(0) ? g[i] + l2 * w[i] : g[i];
        T mm = m[i] * b1 + one_b1 * x;
        T vv = v[i] * b2 + x * x * one_b2;
        const T nw = w[i] - mm / (sqrt(vv) * inv_sqrt_c2 + eps) * lr_c1;
        m[i] = flush(mm, tiny);  // always: the moments decay where the gradient is 0
        v[i] = flush(vv, tiny);
        w[i] = l2 != T(0) ? flush(nw, tiny) : nw;
    }
}

template <typename T>
__global__ void bias_act(T* __restrict__ y, const T* __restrict__ b, long long n, long long d,
                         int relu) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const T v = y[i] + b[i % d];
        y[i] = relu ? v * T(v > T(0)) : v;
    }
}

template <typename T>
__global__ void relu_grad(const T* __restrict__ dy, const T* __restrict__ y,
                          T* __restrict__ dx, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dx[i] = dy[i] * T(y[i] > T(0));
}

// Explicit instantiations, so that nvcc (.ci/run) compiles every kernel pshybrid/cuda.py
// names; RawModule instantiates the same ones from its name_expressions.
#define PSHYBRID_INSTANTIATE_FUSED(T)                                                         \
    template __global__ void bce_logits<T>(const T*, const T*, T*, T*, T, long long);         \
    template __global__ void sgd_update<T>(T*, const T*, long long, T, T, T);                 \
    template __global__ void adagrad_update<T>(T*, const T*, T*, long long, T, T, T, T);      \
    template __global__ void adam_update<T>(T*, const T*, T*, T*, long long, T, T, T, T, T,   \
                                            T, T, T, T);                                      \
    template __global__ void bias_act<T>(T*, const T*, long long, long long, int);            \
    template __global__ void relu_grad<T>(const T*, const T*, T*, long long);
PSHYBRID_INSTANTIATE_FUSED(float)
PSHYBRID_INSTANTIATE_FUSED(double)
