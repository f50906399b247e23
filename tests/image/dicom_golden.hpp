#pragma once
// The DICOM goldens written by tests/golden/make_dicom_golden.py (the golden_files_dicom
// fixture), for the DICOM tests of both test binaries.
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "test_util.hpp"

namespace medfast::test {

inline std::string dicom_dir() { return golden_dir() + "/dicom"; }

inline nlohmann::json dicom_manifest() {
  const std::string text = read_file(dicom_dir() + "/manifest.json");
  if (text.empty()) throw std::runtime_error("DICOM golden manifest missing: run the golden_files_dicom test first");
  return nlohmann::json::parse(text);
}

}  // namespace medfast::test
