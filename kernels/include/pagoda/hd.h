#pragma once
// HD marks functions shared by host code and CUDA device code. The host compiler
// sees nothing; nvcc compiles them for both sides. One definition, no drift.
#if defined(__CUDACC__)
#define HD __host__ __device__ __forceinline__
#else
#define HD inline
#endif
