#pragma once
// The one loader of golden files: a script in tests/golden/ (an independent
// reference: nibabel, numpy, scipy, python3-torch) writes a manifest.json and raw
// little-endian tensors into a folder; tests read them back through GoldenSet.
#include <ATen/ATen.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace medfast::test {

class GoldenSet {
 public:
  /// The set a script writes, made once per test binary (in a temporary folder
  /// removed at exit). A script that fails is reported by every test that asks.
  static const GoldenSet& of(const std::string& script) {
    static std::mutex mutex;
    static std::map<std::string, std::unique_ptr<GoldenSet>> sets;
    std::lock_guard<std::mutex> lock(mutex);
    auto& s = sets[script];
    if (!s) s.reset(new GoldenSet(script));
    if (!s->error_.empty()) throw std::runtime_error(s->error_);
    return *s;
  }

  const nlohmann::json& manifest() const { return manifest_; }
  std::string path(const std::string& file) const { return dir_ / file; }

  /// A tensor the manifest describes as {file, shape, dtype} (dtype float32 when absent).
  at::Tensor tensor(const nlohmann::json& entry) const {
    const std::string bytes = read_file(path(entry.at("file").get<std::string>()));
    const at::Tensor out = at::empty(entry.at("shape").get<std::vector<std::int64_t>>(), dtype(entry));
    const auto want = static_cast<std::size_t>(out.numel()) * out.element_size();
    if (bytes.size() != want) {
      throw std::runtime_error(entry.dump() + ": " + std::to_string(bytes.size()) + " bytes, expected " +
                               std::to_string(want));
    }
    std::memcpy(out.data_ptr(), bytes.data(), want);
    return out;
  }
  /// manifest["tensors"][name].
  at::Tensor tensor(const std::string& name) const { return tensor(manifest_.at("tensors").at(name)); }
  /// A raw float32 file as a vector.
  std::vector<float> floats(const std::string& file) const {
    const std::string bytes = read_file(path(file));
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
  }

 private:
  explicit GoldenSet(const std::string& script) {
    const auto r = run(python() + " " + source_dir() + "/tests/golden/" + script + " " + dir_.path());
    if (r.exit_code != 0) {
      error_ = "tests/golden/" + script + " failed: " + r.err;
      return;
    }
    manifest_ = nlohmann::json::parse(read_file(dir_ / "manifest.json"));
  }
  static at::ScalarType dtype(const nlohmann::json& entry) {
    const std::string d = entry.value("dtype", "float32");
    if (d == "float32") return at::kFloat;
    if (d == "float64") return at::kDouble;
    if (d == "uint8") return at::kByte;
    if (d == "int64") return at::kLong;
    if (d == "int32") return at::kInt;
    throw std::runtime_error("golden tensor dtype '" + d + "' is not known");
  }

  TempDir dir_;
  nlohmann::json manifest_;
  std::string error_;
};

}  // namespace medfast::test
