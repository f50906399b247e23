#include "medfast/image/image_file.hpp"

#include <ATen/ATen.h>

#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"

namespace medfast {

dicom::ReadOptions ImageReadOptions::dicom_options() const {
  return dicom::ReadOptions()
      .set_threads(nifti.threads)
      .set_series_uid(series_uid)
      .set_max_volume_bytes(nifti.max_volume_bytes);
}

bool is_dicom(const std::string& path) { return dicom::looks_like_dicom(path); }

VolumeMeta dicom_volume_meta(const Affine& affine, const std::string& source) {
  VolumeMeta m;
  m.source = source;
  m.qform_code = 1;  // scanner anatomical coordinates
  m.sform_code = 1;
  m.xyzt_units = 2;  // mm
  const auto sp = affine.spacing();
  m.pixdim = {1, sp[0], sp[1], sp[2], 1, 1, 1, 1};
  return m;
}

Volume volume_from_dicom(dicom::Image image, const std::string& source) {
  const at::ScalarType type = image.dtype == "int16" ? at::kShort : image.dtype == "float32" ? at::kFloat : at::kByte;
  const std::size_t capacity = image.storage.size();
  void* base = image.storage.release();
  // Stored x fastest: the contiguous [z][y][x] tensor, permuted to [x][y][z].
  at::Tensor stored = at::from_blob(
      base, {image.shape[2], image.shape[1], image.shape[0]}, [base, capacity](void*) { os::Buffer::free(base, capacity); },
      at::TensorOptions().dtype(type));
  Volume v;
  v.data = stored.permute({2, 1, 0});
  v.affine = image.affine;
  v.meta = dicom_volume_meta(image.affine, source);
  v.meta.dicom = image.series;
  return v;
}

Volume read_image(const std::string& path, const ImageReadOptions& options) {
  if (!is_dicom(path)) return read_nifti(path, options.nifti);
  if (os::stat(path).is_regular && dicom::is_seg_file(path)) {
    throw ValueError(str(path, ": a DICOM SEG or RT Structure Set holds labels for another series; load it together with its image ",
                         "series (LoadImage keys image and label; data convert --reference SERIES_DIR)"));
  }
  return volume_from_dicom(dicom::read_series(path, options.dicom_options()), path);
}

Volume read_seg_volume(const std::string& file, const Volume& reference, const ImageReadOptions& options) {
  if (!reference.meta.dicom) {
    throw ValueError(str(file, ": a DICOM SEG or RT Structure Set is placed on the DICOM series it references, but the reference image (",
                         reference.meta.source, ") was not read from DICOM"));
  }
  return volume_from_dicom(dicom::read_seg(file, *reference.meta.dicom, options.label_dict, options.dicom_options()),
                           file);
}

}  // namespace medfast
