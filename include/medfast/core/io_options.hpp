#pragma once
/// \file
/// The tensor file engine's options (src/io), declared once: each field is a setting
/// (io_<key>: core/settings.cpp takes them from here), a flag of the `io` commands
/// (--<key>) and a keyword argument of the Python API's I/O calls, all derived from
/// fields() below. Here, below the engine, so that the settings registry (core) can list
/// them; the engine itself is io/file_handle.hpp.
#include <cstdint>
#include <string>
#include <tuple>

#include "medfast/core/fields.hpp"
#include "medfast/core/settings.hpp"

/// The host backends, each in its own file src/io/backend_<name>.cpp (posix: pread/pwrite
/// on the engine's workers; odirect: O_DIRECT pieces with bounce buffers; io_uring: one
/// ring per request in flight; cufile: device memory through cuFile, host memory as
/// posix). A new backend is its file and one entry here: the enum, its names, the
/// io_backend setting's choices, the flags and the factory table follow.
#define MEDFAST_IO_BACKENDS(X) X(posix) X(odirect) X(io_uring) X(cufile)

namespace medfast::io {

#define MEDFAST_IO_BACKEND_LISTED(name) "," #name
/// "auto" and every backend's name, comma-separated (the io_backend setting's choices).
inline constexpr const char* kIoBackendChoices = "auto" MEDFAST_IO_BACKENDS(MEDFAST_IO_BACKEND_LISTED);
#undef MEDFAST_IO_BACKEND_LISTED

/// Options of the engine; every field is also a setting (io_*).
struct IoOptions {
  std::string backend = "auto";  ///< auto | posix | odirect | io_uring | cufile
  std::uint64_t block_size = kDefaultIoBlockSize;
  int queue_depth = kDefaultIoQueueDepth;
  /// posix/odirect workers; 0: the threads setting (IoOptions::from), one where the options
  /// are made without settings.
  int threads = kDefaultIoThreads;
  bool direct = true;
  /// O_DIRECT reads take what the page cache already holds from it first (without waiting:
  /// os::File::read_cached), the rest direct: a file read again (a disk cache, a checkpoint
  /// just written) comes from memory. false: every byte O_DIRECT.
  bool cache_first = true;
  std::uint64_t alignment = kDefaultIoAlignment;

  static constexpr auto fields() {
    using O = IoOptions;
    return std::make_tuple(
        field("backend", &O::backend, "tensor file I/O backend (auto: io_uring if the kernel allows it, else posix)")
            .one_of(kIoBackendChoices),
        field("block_size", &O::block_size, "bytes per I/O request").bytes(),
        field("queue_depth", &O::queue_depth, "io_uring requests kept in flight").range(1, 4096),
        field("threads", &O::threads, "posix and odirect backend worker threads (0: the threads setting)")
            .range(0, kMaxThreads),
        field("direct", &O::direct, "O_DIRECT (bypass the page cache) for odirect and io_uring"),
        field("cache_first", &O::cache_first,
              "O_DIRECT reads take what the page cache already holds from it first, without waiting, the rest "
              "direct (a file read again comes from memory); off: every byte O_DIRECT"),
        field("alignment", &O::alignment, "O_DIRECT buffer/offset/length alignment").bytes());
  }

  IoOptions& set_backend(const std::string& v);
  IoOptions& set_block_size(std::uint64_t v);
  IoOptions& set_queue_depth(int v);
  IoOptions& set_threads(int v);
  IoOptions& set_direct(bool v) {
    direct = v;
    return *this;
  }
  IoOptions& set_cache_first(bool v) {
    cache_first = v;
    return *this;
  }
  IoOptions& set_alignment(std::uint64_t v);
  /// Throws ValueError naming the field (block_size must be a multiple of alignment...).
  void validate() const;
  /// The workers: threads, or one where it is 0 (options made without settings).
  int workers() const { return threads > 0 ? threads : 1; }
  /// From the resolved io_* settings (io_threads 0: the threads setting).
  static IoOptions from(const Settings& settings);
};

/// The settings prefix of IoOptions' fields.
inline constexpr const char* kIoSettingPrefix = "io_";

}  // namespace medfast::io
