// libFuzzer target: the NIfTI header parser, the gzip layer and the raw
// decoder, on arbitrary bytes taken as a whole .nii or .nii.gz file. Any
// input must end in a decoded image or a medfast::Error, never a crash, a
// sanitizer report, a hang or an allocation beyond max_volume_bytes.
#include <cstddef>
#include <cstdint>

#include "medfast/core/error.hpp"
#include "medfast/image/affine.hpp"
#include "medfast/image/nifti_raw.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace medfast;
  const auto options = NiftiReadOptions().set_max_volume_bytes(64u << 20);
  try {
    const nifti::RawImage img = nifti::decode_memory(data, size, "fuzz-input", options);
    const std::uint64_t n = img.header.data_bytes();
    if (n > 0) {
      volatile std::uint8_t last = static_cast<const std::uint8_t*>(img.data())[n - 1];
      (void)last;
    }
    const Affine a = img.header.best_affine();
    volatile auto codes = axcodes(a).size();
    (void)codes;
    (void)affine_to_qform(a);
  } catch (const Error&) {
    // Rejected with a message: the expected outcome for most inputs.
  }
  return 0;
}
