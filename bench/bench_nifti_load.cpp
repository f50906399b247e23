// Loads an image (a NIfTI file, or a DICOM series folder) N times with medfast and prints,
// as JSON, the seconds of each load and a CRC-32 of the voxels in file order, x fastest
// (so the driver can check them against nibabel's or pydicom's before comparing speeds).
// --drop-cache asks the kernel to drop the files' pages before each load (cold reads).
//   bench_nifti_load PATH [--repeat N] [--threads T] [--drop-cache 1]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "medfast/image/dicom.hpp"
#include "medfast/image/image_file.hpp"
#include "medfast/os/file.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_nifti_load FILE [--repeat N] [--threads T]\n");
    return 2;
  }
  const std::string file = argv[1];
  int repeat = 5, threads = 1;
  bool drop = false;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--repeat")) repeat = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--drop-cache")) drop = std::atoi(argv[i + 1]) != 0;
  }
  at::set_num_threads(threads);
  medfast::ImageReadOptions options;
  options.nifti.set_threads(threads);
  try {
    std::vector<double> seconds;
    unsigned long crc = 0;
    std::uint64_t bytes = 0;
    for (int r = 0; r < repeat; ++r) {
      if (drop) {
        for (const std::string& f : medfast::dicom::files_of(file)) {
          medfast::os::File::open(f, medfast::os::File::Mode::read).drop_cache();
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      const medfast::Volume v = medfast::read_image(file, options);
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
