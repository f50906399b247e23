#include "medfast/image/volume.hpp"

#include <ATen/ATen.h>

namespace medfast {

std::vector<std::int64_t> Volume::shape() const {
  if (!data.defined()) return {};
  return data.sizes().vec();
}

std::string dtype_name(const at::Tensor& t) {
  switch (t.scalar_type()) {
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
    default: return std::string(c10::toString(t.scalar_type()));
  }
}

std::string Volume::dtype_name() const { return data.defined() ? medfast::dtype_name(data) : "undefined"; }

std::uint64_t Volume::bytes_in_memory() const {
  return data.defined() ? static_cast<std::uint64_t>(data.numel()) * data.element_size() : 0;
}

}  // namespace medfast
