// libFuzzer target: the DICOM reader (medfast's parser; its RLE and lossless JPEG decoders,
// CharLS, OpenJPEG and libjpeg-turbo behind medfast's frame checks; the header,
// geometry, pixel and SEG code) on arbitrary bytes taken as one DICOM file. Any input must
// end in a result or a medfast::Error, never a crash, a sanitizer report or a hang.
#include <cstddef>
#include <cstdint>

#include "medfast/image/dicom.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  medfast::dicom::parse_for_fuzzing(data, size);  // catches medfast::Error itself
  return 0;
}
