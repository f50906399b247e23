#include "medfast/image/volume.hpp"

#include "medfast/os/memory.hpp"

#include <ATen/ATen.h>

#include "medfast/core/error.hpp"

namespace medfast {

std::vector<std::int64_t> Volume::shape() const {
  if (!data.defined()) return {};
  return data.sizes().vec();
}

std::string dtype_name(const at::Tensor& t) { return dtype_name(t.scalar_type()); }

at::ScalarType parse_dtype(const std::string& name, const std::string& what) {
  for (at::ScalarType t : {at::kByte, at::kChar, at::kShort, at::kInt, at::kLong, at::kHalf, at::kBFloat16, at::kFloat,
                           at::kDouble, at::kBool}) {
    if (name == dtype_name(t)) return t;
  }
  throw ValueError(str(what, ": dtype '", name,
                       "' is not one of uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, bool"));
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kBool: return "bool";
    default: return std::string(c10::toString(t));
  }
}

std::string Volume::dtype_name() const { return data.defined() ? medfast::dtype_name(data) : "undefined"; }

std::uint64_t Volume::bytes_in_memory() const {
  return data.defined() ? static_cast<std::uint64_t>(data.numel()) * data.element_size() : 0;
}

}  // namespace medfast

namespace medfast {

at::Tensor pooled_empty(at::IntArrayRef shape, at::ScalarType dtype) {
  const std::size_t bytes = static_cast<std::size_t>(c10::multiply_integers(shape)) * c10::elementSize(dtype);
  if (bytes == 0) return at::empty(shape, at::TensorOptions().dtype(dtype));
  os::Buffer b = os::Buffer::allocate(bytes);
  const std::size_t capacity = b.size();
  void* p = b.release();
  return at::from_blob(p, shape, [p, capacity](void*) { os::Buffer::free(p, capacity); },
                       at::TensorOptions().dtype(dtype));
}

}  // namespace medfast
