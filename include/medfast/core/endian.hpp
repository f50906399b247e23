#pragma once
/// \file
/// Little-endian whole numbers read from a file format's bytes (DICOM, its RLE headers, the
/// zip archives torch.save writes), whatever the machine's own byte order.
#include <cstddef>
#include <cstdint>

namespace medfast {

/// The little-endian T at `p` (an unsigned whole number of 2, 4 or 8 bytes).
template <typename T>
constexpr T load_le(const unsigned char* p) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | static_cast<T>(static_cast<T>(p[i]) << (8 * i)));
  return v;
}
constexpr std::uint16_t le16(const unsigned char* p) { return load_le<std::uint16_t>(p); }
constexpr std::uint32_t le32(const unsigned char* p) { return load_le<std::uint32_t>(p); }
constexpr std::uint64_t le64(const unsigned char* p) { return load_le<std::uint64_t>(p); }

}  // namespace medfast
