// DICOM input, torch-free (these also run in the sanitizer job): golden parity with an
// independent pydicom + numpy reader on series written by pydicom and dcmtk
// (tests/golden/make_dicom_golden.py: shuffled file order, oblique orientation, rescale,
// several series in a folder, enhanced multi-frame CT, JPEG lossless, JPEG-LS and RLE),
// SEG placement by label_dict, and bad inputs naming the file and the tag.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "medfast/core/log.hpp"
#include "medfast/image/dicom.hpp"
#include "dicom_golden.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

using test::dicom_dir;
using test::dicom_manifest;

/// Captures log lines for the lifetime of the object.
struct LogCapture {
  std::vector<std::string> lines;
  LogCapture() {
    log::set_sink([this](log::Level, const std::string& m) { lines.push_back(m); });
  }
  ~LogCapture() { log::set_sink(nullptr); }
  bool any(const std::string& fragment) const {
    for (const auto& l : lines) {
      if (l.find(fragment) != std::string::npos) return true;
    }
    return false;
  }
};

Affine affine_of(const nlohmann::json& rows) {
  Affine a;
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) a(r, c) = rows[r][c].get<double>();
  return a;
}

/// The expected voxels (x fastest) against an image's storage, byte for byte.
void expect_voxels(const dicom::Image& img, const nlohmann::json& expect, const std::string& name) {
  const std::string bytes = test::read_file(dicom_dir() + "/" + expect["voxels"].get<std::string>());
  ASSERT_EQ(img.dtype, expect["dtype"].get<std::string>()) << name;
  const auto shape = expect["shape"].get<std::vector<std::int64_t>>();
  ASSERT_EQ(std::vector<std::int64_t>(img.shape.begin(), img.shape.end()), shape) << name;
  ASSERT_EQ(bytes.size(), static_cast<std::size_t>(shape[0] * shape[1] * shape[2]) *
                              (img.dtype == "uint8" ? 1 : img.dtype == "int16" ? 2 : 4))
      << name;
  if (std::memcmp(bytes.data(), img.storage.data(), bytes.size()) != 0) {
    std::size_t at = 0;
    while (at < bytes.size() && bytes[at] == static_cast<const char*>(img.storage.data())[at]) ++at;
    ADD_FAILURE() << name << ": voxels differ from the pydicom reader's, first at byte " << at;
  }
  EXPECT_LE(img.affine.max_abs_diff(affine_of(expect["affine"])), 1e-6)
      << name << "\nmedfast:\n" << img.affine.to_string() << "\npydicom:\n" << affine_of(expect["affine"]).to_string();
}

/// The golden series whose transfer syntax needs CharLS, OpenJPEG or libjpeg-turbo.
bool needs_codecs(const std::string& name) {
  for (const char* k : {"jpeg_ls", "jpeg2000", "jpeg_baseline"}) {
    if (name.find(k) != std::string::npos) return true;
  }
  return false;
}

TEST(DicomGolden, SeriesEqualAnIndependentPydicomReader) {
  const auto m = dicom_manifest();
  ASSERT_GE(m["series"].size(), 8u);
  for (const auto& c : m["series"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    for (int threads : {1, 2}) {
      LogCapture logs;
      auto o = dicom::ReadOptions().set_threads(threads);
      if (c.contains("series_uid") && c["series_uid"].is_string()) o.set_series_uid(c["series_uid"]);
      const std::string input = dicom_dir() + "/" + c["input"].get<std::string>();
      if (!build::kDicomCodecs && needs_codecs(name)) {
        // A build without CharLS, OpenJPEG and libjpeg-turbo says so, naming the option.
        const std::string m = test::error_of<Error>([&] { dicom::read_series(input, o); });
        EXPECT_NE(m.find("MEDFAST_WITH_DICOM_CODECS"), std::string::npos) << m;
        continue;
      }
      const dicom::Image img = dicom::read_series(input, o);
      expect_voxels(img, c["expect"], name);
      ASSERT_TRUE(img.series);
      EXPECT_EQ(img.series->series_uid, c["expect"]["series_uid"].get<std::string>());
      EXPECT_EQ(img.series->files.size(), c["expect"]["files"].get<std::size_t>());
      EXPECT_EQ(logs.any("uneven slice spacing"), c["warning"].get<bool>()) << name;
    }
  }
}

TEST(DicomGolden, SegIsPlacedOnItsSeriesByLabelDict) {
  const auto m = dicom_manifest();
  ASSERT_GE(m["segs"].size(), 5u);
  for (const auto& c : m["segs"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const dicom::Image ref = dicom::read_series(dicom_dir() + "/" + c["reference"].get<std::string>());
    dicom::LabelDict labels;
    if (c["label_dict"].is_array()) {
      for (const auto& p : c["label_dict"]) labels.emplace_back(p[0].get<std::string>(), p[1].get<int>());
    }
    const dicom::Image seg = dicom::read_seg(dicom_dir() + "/" + c["seg"].get<std::string>(), *ref.series, labels);
    expect_voxels(seg, c["expect"], name);
  }
}

TEST(DicomErrors, BadInputsNameTheFileAndTheTag) {
  const auto m = dicom_manifest();
  ASSERT_GE(m["errors"].size(), 8u);
  for (const auto& c : m["errors"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    std::string message = "(no error)";
    try {
      const std::string input = dicom_dir() + "/" + c["input"].get<std::string>();
      if (c.contains("reference") && c["reference"].is_string()) {
        const dicom::Image ref = dicom::read_series(dicom_dir() + "/" + c["reference"].get<std::string>());
        dicom::LabelDict labels;
        if (c.contains("label_dict") && c["label_dict"].is_array()) {
          for (const auto& p : c["label_dict"]) labels.emplace_back(p[0].get<std::string>(), p[1].get<int>());
        }
        (void)dicom::read_seg(input, *ref.series, labels);
      } else {
        (void)dicom::read_series(input);
      }
    } catch (const FormatError& e) {
      message = e.what();
    } catch (const std::exception& e) {
      message = std::string("(not a FormatError) ") + e.what();
    }
    if (!build::kDicomCodecs && needs_codecs(name)) {  // the frame's decoder is missing: its error names the option
      EXPECT_NE(message.find("MEDFAST_WITH_DICOM_CODECS"), std::string::npos) << message;
      continue;
    }
    for (const auto& fragment : c["expect_error"]) {
      EXPECT_NE(message.find(fragment.get<std::string>()), std::string::npos)
          << name << ": '" << fragment.get<std::string>() << "' not in: " << message;
    }
  }
}

// Headers that announce far more pixels than their files hold (65535 x 65535 over 8 KB,
// 100000 frames over one) are refused by the pixel data's length before the volume is
// allocated: read here with the address space limited to 2 GiB more than the process maps
// now. Before, the 65535 x 65535 series asked for 24 GiB first, and the frames were
// called "frames at the same position".
TEST(DicomErrors, AnnouncedSizesAreCheckedAgainstThePixelDataBeforeAllocating) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer reserves terabytes of address space: no limit can be set here";
#endif
  std::uint64_t pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  ASSERT_GT(pages, 0u);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &old), 0);
  struct Restore {
    rlimit limit;
    ~Restore() { ::setrlimit(RLIMIT_AS, &limit); }
  } restore{old};
  rlimit tight = old;
  tight.rlim_cur = pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) + (std::uint64_t{2} << 30);
  if (old.rlim_max != RLIM_INFINITY && tight.rlim_cur > old.rlim_max) tight.rlim_cur = old.rlim_max;
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &tight), 0);
  const auto read = [](const std::string& name) {
    return test::error_of<FormatError>([&] { dicom::read_series(dicom_dir() + "/errors/" + name); });
  };
  EXPECT_TRUE(test::contains_all(read("huge_rows"), {"/errors/huge_rows/slice", "PixelData (7FE0,0010) holds 8192 bytes, expected 8589672450 for 65535 rows x 65535 columns x 1 frame(s) of 16 bits"}));
  EXPECT_TRUE(test::contains_all(read("frames_past_data"), {"/errors/frames_past_data/frames.dcm: PixelData (7FE0,0010) holds 2460 bytes, expected 246000000 for 30 rows x 41 columns x 100000 frame(s) of 16 bits"}));
}

}  // namespace
}  // namespace medfast
