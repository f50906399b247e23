#pragma once
/// \file
/// Tensors in and out of files through the engine (file_handle.hpp).
///
/// CPU tensors (pageable or pinned) are read and written in place. CUDA
/// tensors use cuFile (GPUDirect Storage, loaded with dlopen) when it is
/// there; otherwise bytes bounce through two pinned host buffers: while one
/// is copied to the device asynchronously on the current stream, the next
/// chunk is read into the other (an event per buffer orders reuse, no
/// device-wide sync). The copies are libtorch ops, so ROCm works the same.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <future>
#include <string>

#include "medfast/io/file_handle.hpp"

namespace medfast::io {

/// A CPU uint8 tensor of `bytes` whose memory is aligned for O_DIRECT.
at::Tensor empty_aligned(std::size_t bytes);

/// Reads dst.nbytes() bytes at `offset` into a contiguous tensor (CPU or
/// CUDA); returns the bytes read (fewer only at end of file).
std::size_t read_into(FileHandle& file, const at::Tensor& dst, std::uint64_t offset = 0);
/// Writes src's bytes (a contiguous tensor, CPU or CUDA) at `offset`.
void write_from(FileHandle& file, const at::Tensor& src, std::uint64_t offset = 0);

std::future<std::size_t> read_into_async(FileHandle& file, const at::Tensor& dst, std::uint64_t offset = 0);
std::future<void> write_from_async(FileHandle& file, const at::Tensor& src, std::uint64_t offset = 0);

/// How device memory is reached: "cufile" or "bounce (pinned host buffers)".
std::string device_path(FileHandle& file);

}  // namespace medfast::io
