#pragma once
/// \file
/// The file engine's conformance fixture, shared by the torch-free suite
/// (test_file_handle.cpp) and the tensor one (test_tensor_io.cpp): every backend
/// configuration this machine has (io_uring where the kernel allows it), in a fresh
/// temporary folder per test.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "medfast/core/random.hpp"
#include "medfast/io/file_handle.hpp"
#include "test_util.hpp"

namespace medfast::io::conformance {

inline std::string random_bytes(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng.next() >> 56);
  return s;
}

struct Config {
  std::string name;
  IoOptions options;
};

inline std::vector<Config> configs() {
  std::vector<Config> c;
  c.push_back({"posix", IoOptions().set_backend("posix").set_threads(3)});
  c.push_back({"posix_small_blocks", IoOptions().set_backend("posix").set_threads(4).set_block_size(8192)});
  c.push_back({"odirect", IoOptions().set_backend("odirect").set_threads(2)});
  // O_DIRECT for every byte (the files the tests write are in the page cache, which the
  // default configurations read first)
  c.push_back({"odirect_small_blocks",
               IoOptions().set_backend("odirect").set_threads(3).set_block_size(8192).set_cache_first(false)});
  c.push_back({"odirect_512",
               IoOptions().set_backend("odirect").set_alignment(512).set_block_size(4096).set_cache_first(false)});
  c.push_back({"odirect_buffered", IoOptions().set_backend("odirect").set_direct(false)});
  if (probe().io_uring) {
    c.push_back({"io_uring", IoOptions().set_backend("io_uring")});
    c.push_back({"io_uring_small",
                 IoOptions().set_backend("io_uring").set_block_size(8192).set_queue_depth(4).set_cache_first(false)});
    c.push_back({"io_uring_buffered", IoOptions().set_backend("io_uring").set_direct(false).set_block_size(8192)});
  }
  return c;
}

inline void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

class Conformance : public ::testing::TestWithParam<Config> {
 protected:
  test::TempDir dir;
  const IoOptions& options() const { return GetParam().options; }
};

}  // namespace medfast::io::conformance
