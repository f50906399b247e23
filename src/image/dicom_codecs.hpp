// Compressed DICOM pixel data, one frame at a time (private to src/image).
//
// Every decoder here returns an error for a damaged stream; none asserts or aborts:
//   RLE Lossless                      medfast (PS3.5 Annex G)
//   JPEG lossless (processes 14)      medfast (ITU T.81 Annex H: Huffman, predictors 1-7,
//                                     point transform, restart intervals)
//   JPEG baseline/extended, 8 bits    libjpeg-turbo
//   JPEG-LS lossless/near-lossless    CharLS
//   JPEG 2000 (J2K codestream or JP2) OpenJPEG
// (GDCM 3.0's codec layer asserts on damaged streams, e.g. a JPEG-LS frame whose header
// disagrees with Rows/Columns, so it is not used to decode.)
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace medfast::dicom::codecs {

/// One encapsulated fragment's bytes (in the file's buffer).
using Fragment = std::pair<const unsigned char*, std::size_t>;

/// What one decoded frame must hold, and what error messages name.
struct FrameSpec {
  std::string file;    ///< the DICOM file, for messages
  std::string syntax;  ///< its Transfer Syntax UID
  int rows = 0, columns = 0;
  int bits_allocated = 16;  ///< 8 or 16 (RLE also 32)
  int bits_stored = 16;
  bool is_signed = false;  ///< Pixel Representation 1
};

/// Whether medfast decodes this transfer syntax (a compressed one).
bool decodes(const std::string& syntax);

/// The fragments of each of `frames` frames. `fragments[0]` is the Basic Offset Table;
/// frames are told apart by it, by one fragment per frame, or by where each stream starts.
std::vector<std::vector<Fragment>> split_frames(const std::vector<Fragment>& fragments, int frames,
                                                const FrameSpec& spec);

/// Decodes one frame into `out`: rows x columns samples of bits_allocated bits, little
/// endian, the stored bit pattern (signed values sign-extended from the stream's
/// precision). Throws FormatError naming the file, the syntax and what was wrong.
void decode_frame(const FrameSpec& spec, const std::vector<Fragment>& frame, char* out);

}  // namespace medfast::dicom::codecs
