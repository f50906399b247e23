#pragma once
// The transforms' parallel loop: libtorch's intra-op threads, except on an item worker
// (core/parallel.hpp), which runs it serially.
#include <ATen/Parallel.h>

#include <cstdint>

#include "medfast/core/parallel.hpp"

namespace medfast::transforms {

template <typename F>
void kernel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, const F& f) {
  if (item_worker()) {
    if (begin < end) f(begin, end);
    return;
  }
  at::parallel_for(begin, end, grain, f);
}

}  // namespace medfast::transforms
