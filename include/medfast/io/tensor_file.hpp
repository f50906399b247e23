#pragma once
/// \file
/// Whole tensors in files, through the tensor file engine (tensor_io.hpp).
///
/// save_bytes/load_bytes move a tensor's raw bytes, nothing else (DeepNVMe's
/// aio_handle save/load). save_tensor/load_tensor keep dtype and shape too, in an
/// "MFTENSOR" file, the round trip torch.save/torch.load give:
///
///   bytes 0-7    magic "MFTENSOR"
///   bytes 8-11   format version (1), little-endian u32
///   bytes 12-15  JSON length J, u32
///   J bytes      {"dtype": "float32", "shape": [..], "bytes": N, "xxh3": H or null}
///   zeros        up to the next 4 KiB boundary: the payload is O_DIRECT-, io_uring-
///                and cuFile-ready
///   N bytes      the payload, C-contiguous
///
/// Files are written to a temporary name and renamed over the target (fsynced
/// unless `durable` is false), so a reader never sees half a file. The XXH3-64
/// of a CPU tensor's payload is stored and checked on load unless `verify` is
/// false (a CUDA destination then takes the pinned bounce, where the bytes pass
/// through host memory).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "medfast/io/file_handle.hpp"

namespace medfast::io {

inline constexpr std::uint32_t kTensorFileVersion = 1;
inline constexpr std::uint64_t kTensorFileAlignment = 4096;

void save_bytes(const at::Tensor& tensor, const std::string& path, const IoOptions& io = {}, bool durable = true);
/// The file's bytes into `out` (at most out.nbytes(); returns the bytes read), or,
/// with `out` undefined, into a new uint8 tensor of the file's size on `device`.
at::Tensor load_bytes(const std::string& path, at::Tensor out = {}, const std::string& device = "cpu",
                      const IoOptions& io = {});

void save_tensor(const at::Tensor& tensor, const std::string& path, const IoOptions& io = {}, bool durable = true);
/// FormatError naming the file for a file that is not one, is cut short or fails its checksum.
at::Tensor load_tensor(const std::string& path, const std::string& device = "cpu", const IoOptions& io = {},
                       bool verify = true);

}  // namespace medfast::io
