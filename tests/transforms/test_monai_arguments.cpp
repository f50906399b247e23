// Every MONAI argument of every named transform is taken or refused as MONAI's (issue 54):
// tests/reference/monai_transform_args.json holds MONAI 1.3.2's dictionary transforms'
// parameters (tests/golden/make_monai_transform_args.py recorded them from the MONAI peer).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "medfast/transforms/random.hpp"
#include "medfast/transforms/transform.hpp"
#include "test_util.hpp"

namespace medfast::transforms {
namespace {

// The least each transform needs besides the argument under test.
nlohmann::json base_arguments(const std::string& name) {
  static const auto bases = nlohmann::json::parse(R"({
    "Orientation": {"axcodes": "RAS"}, "Spacing": {"pixdim": [1, 1, 1]},
    "ScaleIntensityRange": {"a_min": 0, "a_max": 1}, "CropForeground": {"source_key": "image"},
    "ResizeWithPadOrCrop": {"spatial_size": 4}, "SpatialPad": {"spatial_size": 4}, "ToDevice": {"device": "cpu"},
    "MapLabelValue": {"orig_labels": [1], "target_labels": [2]},
    "RandCropByPosNegLabel": {"label_key": "image", "spatial_size": 4}, "RandSpatialCrop": {"roi_size": 4},
    "RandScaleIntensity": {"factors": 0.1}, "RandShiftIntensity": {"offsets": 0.1}})");
  nlohmann::json args = bases.contains(name) ? bases[name] : nlohmann::json::object();
  args["keys"] = nlohmann::json::array({"image"});
  return args;
}

bool is_random(const std::string& name) {
  const auto r = random_names();
  return std::find(r.begin(), r.end(), name) != r.end();
}

// The message of what making `name` with `args` throws; "" where it is made.
std::string made(const std::string& name, const nlohmann::json& args) {
  try {
    if (is_random(name))
      (void)make_random(name, args);
    else
      (void)make(name, args);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

nlohmann::json recorded() {
  return nlohmann::json::parse(test::read_file(test::source_dir() + "/tests/reference/monai_transform_args.json"));
}

TEST(MonaiArguments, EveryRegisteredTransformOfMonaisIsRecorded) {
  const auto ref = recorded();
  auto all = names();
  for (const auto& n : random_names()) all.push_back(n);
  for (const auto& name : all) {
    if (name == "LabelToRegions") continue;  // medfast's own
    EXPECT_TRUE(ref.contains(name)) << name << ": not in tests/reference/monai_transform_args.json (add it to "
                                    << "tests/golden/make_monai_transform_args.py's NAMES and record again)";
  }
}

TEST(MonaiArguments, EachIsTakenOrRefusedAsMonais) {
  const auto ref = recorded();
  std::size_t taken = 0, refused = 0;
  for (const auto& [name, params] : ref.items()) {
    if (name == "_about") continue;
    const nlohmann::json base = base_arguments(name);
    ASSERT_EQ(made(name, base), "") << name << ": the test's base arguments";
    for (const auto& p : params) {
      const std::string arg = p[0];
      if (base.contains(arg)) {
        ++taken;
        continue;
      }
      SCOPED_TRACE(name + " " + arg);
      nlohmann::json args = base;
      args[arg] = "not-a-value-of-monai";
      const std::string m = made(name, args);
      EXPECT_EQ(m.find("unknown argument"), std::string::npos) << m;
      const std::string refusal = name + ": MONAI's argument '" + arg + "' is not supported by medfast";
      if (m.find("MONAI's argument") == std::string::npos) {  // read (a bad value is its reader's error)
        ++taken;
        continue;
      }
      ++refused;
      EXPECT_EQ(m.rfind(refusal, 0), 0u) << m;
      // MONAI's default changes nothing: taken.
      const nlohmann::json& fallback = p[1];
      if (fallback.is_string() && (fallback == "<required>" || fallback == "<object>")) continue;
      args[arg] = fallback;
      EXPECT_EQ(made(name, args), "") << "with MONAI's default " << fallback.dump();
    }
  }
  EXPECT_GT(taken, 40u);
  EXPECT_GT(refused, 40u);
}

TEST(MonaiArguments, OthersStayUnknownWithTheKnownOnes) {
  EXPECT_TRUE(test::contains_all(
      made("RandSpatialCrop", nlohmann::json::parse(R"({"keys": "image", "roi_size": 4, "lazzy": true})")),
      {"RandSpatialCrop: unknown argument 'lazzy' (known: keys, roi_size, max_roi_size, "
       "random_center, random_size)"}));
  EXPECT_EQ(made("RandSpatialCrop", nlohmann::json::parse(R"({"keys": "image", "roi_size": 4, "lazy": true})")),
            "RandSpatialCrop: MONAI's argument 'lazy' is not supported by medfast (only its default, false)");
  EXPECT_EQ(made("RandSpatialCrop", nlohmann::json::parse(R"({"keys": "image", "roi_size": 4, "lazy": false})")), "");
  EXPECT_EQ(made("Spacing", nlohmann::json::parse(R"({"keys": "image", "pixdim": 1, "dtype": "float64"})")),
            "Spacing: MONAI's argument 'dtype' is not supported by medfast");
  // In a chain: the item named too.
  EXPECT_TRUE(test::contains_all(
      test::value_error_of([] {
        make_chain(
            nlohmann::json::parse(R"([{"name": "Orientation", "keys": "image", "axcodes": "RAS", "lazy": true}])"));
      }),
      {"Orientation: MONAI's argument 'lazy' is not supported by medfast", "transform chain item 0"}));
}

}  // namespace
}  // namespace medfast::transforms
