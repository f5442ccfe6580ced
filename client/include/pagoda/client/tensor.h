#pragma once
// Tensors on the wire are raw row-major little-endian bytes with a dtype and a
// shape. The client computes in fp32 and converts at the boundary: encode_values
// turns floats into wire bytes of any dtype (rounding to nearest even), and
// decode_values turns wire bytes back into floats after checking that the byte
// count matches the shape.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/client/error.h"
#include "pagoda/dtype.h"

namespace pagoda::client {

// A host tensor of fp32 values with its shape; `dtype` is the element type it
// travels (or travelled) as.
struct FloatTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // dimensions, outermost first
  std::vector<float> values;   // [product(shape)]
};

// product(shape); 1 for a scalar (empty shape).
int64_t element_count(std::span<const int64_t> shape);

// `values` as wire bytes of `dtype`: n * dtype_size(dtype) bytes, little-endian.
std::string encode_values(std::span<const float> values, DType dtype);

// Wire bytes of `dtype` back to fp32. Fails (naming `field`) when the byte count
// is not count * dtype_size(dtype).
Result<std::vector<float>> decode_values(std::string_view bytes, DType dtype, int64_t count,
                                         std::string_view field);

// The values as they come out of a round trip through `dtype` (what the server
// stores when its cache dtype is `dtype`): fp32 is unchanged.
std::vector<float> round_to_dtype(std::span<const float> values, DType dtype);

// Wire enum number (pagoda.v1.DType) of a dtype and back; 0 is DTYPE_UNSPECIFIED.
int wire_dtype(DType dtype);
Result<DType> dtype_from_wire(int number, std::string_view field);

}  // namespace pagoda::client
