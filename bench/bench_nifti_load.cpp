// Loads a NIfTI file N times with medfast and prints, as JSON, the seconds of
// each load and a CRC-32 of the voxels in file order (so the driver can check
// them against nibabel's before comparing speeds).
//   bench_nifti_load FILE [--repeat N] [--threads T]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "medfast/image/nifti.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_nifti_load FILE [--repeat N] [--threads T]\n");
    return 2;
  }
  const std::string file = argv[1];
  int repeat = 5, threads = 1;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--repeat")) repeat = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  }
  at::set_num_threads(threads);
  const auto options = medfast::NiftiReadOptions().set_threads(threads);
  try {
    std::vector<double> seconds;
    unsigned long crc = 0;
    std::uint64_t bytes = 0;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const medfast::Volume v = medfast::read_nifti(file, options);
      const auto t1 = std::chrono::steady_clock::now();
      seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
      if (r == 0) {
        // File order (x fastest) is the contiguous layout of the reversed dims.
        std::vector<std::int64_t> rev;
        for (auto d = v.data.dim() - 1; d >= 0; --d) rev.push_back(d);
        const at::Tensor c = v.data.permute(rev).contiguous();
        bytes = static_cast<std::uint64_t>(c.numel()) * c.element_size();
        crc = crc32_z(0L, static_cast<const Bytef*>(c.data_ptr()), bytes);
      }
    }
    std::printf("{\"file\": \"%s\", \"threads\": %d, \"bytes\": %llu, \"crc32\": %lu, \"seconds\": [", file.c_str(),
                threads, static_cast<unsigned long long>(bytes), crc);
    for (std::size_t i = 0; i < seconds.size(); ++i) std::printf("%s%.6f", i ? ", " : "", seconds[i]);
    std::printf("]}\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_nifti_load: %s\n", e.what());
    return 1;
  }
  return 0;
}
