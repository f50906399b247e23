#pragma once
// Helpers shared by the tests: temporary folders, running commands, reading files.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/version.hpp"

namespace medfast::test {

/// A fresh folder under $TMPDIR, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/medfast-test-XXXXXX";
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  ///< stdout
  std::string err;  ///< stderr
};

/// Runs a shell command, capturing stdout and stderr.
inline CommandResult run(const std::string& command) {
  TempDir tmp;
  const std::string out = tmp / "out", err = tmp / "err";
  const int status = std::system((command + " >'" + out + "' 2>'" + err + "'").c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream o(out), e(err);
  std::stringstream so, se;
  so << o.rdbuf();
  se << e.rdbuf();
  r.out = so.str();
  r.err = se.str();
  return r;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

/// The spleen fast-training deterministic chain (labels keep their file dtype).
inline const char* spleen_chain_json() {
  return R"([
  {"name": "LoadImage", "keys": ["image", "label"], "dtype": ["float32", ""]},
  {"name": "EnsureChannelFirst", "keys": ["image", "label"]},
  {"name": "Orientation", "keys": ["image", "label"], "axcodes": "RAS"},
  {"name": "Spacing", "keys": ["image", "label"], "pixdim": [1.5, 1.5, 2.0], "mode": ["bilinear", "nearest"]},
  {"name": "ScaleIntensityRange", "keys": "image", "a_min": -57, "a_max": 164, "b_min": 0.0, "b_max": 1.0, "clip": true},
  {"name": "CropForeground", "keys": ["image", "label"], "source_key": "image"},
  {"name": "FgBgToIndices", "keys": "label", "image_key": "image"}])";
}

/// Runs f and hands the E it throws to `check`, for a test that looks at more of the error
/// than its message (an OsError's errno_value()). Where f throws nothing, or an exception
/// other than an E, the test fails and `check` is not called.
template <typename E, typename F, typename C>
void with_error(F&& f, C&& check) {
  try {
    f();
  } catch (const E& e) {
    check(e);
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "an exception other than the one expected: " << e.what();
    return;
  }
  ADD_FAILURE() << "no exception where one was expected";
}

/// The message of the E that f throws. Where f throws nothing, or an exception other than
/// an E, the test fails and the result is a note that contains none of the fragments a test
/// looks for.
template <typename E, typename F>
std::string error_of(F&& f) {
  std::string message = "(no exception, or not the one expected)";
  with_error<E>(std::forward<F>(f), [&](const E& e) { message = e.what(); });
  return message;
}

/// Whether `text` contains every one of `fragments`; a failure names the missing ones and
/// shows the text. Use: EXPECT_TRUE(test::contains_all(m, {"item 1", "missing.nii.gz"})).
inline ::testing::AssertionResult contains_all(const std::string& text, const std::vector<std::string>& fragments) {
  std::string missing;
  for (const std::string& f : fragments) {
    if (text.find(f) == std::string::npos) missing += (missing.empty() ? "'" : ", '") + f + "'";
  }
  if (missing.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "missing " << missing << " in: " << text;
}

/// The message of the ValueError f throws, or a note saying what happened instead.
template <typename F>
std::string value_error_of(F&& f) {
  return error_of<ValueError>(std::forward<F>(f));
}

/// Skips a test that needs a GPU, saying why. Tests that use it have "Gpu" in their
/// suite name: tests/CMakeLists.txt gives those the ctest label gpu.
#define MEDFAST_REQUIRE_CUDA()                                                                       \
  do {                                                                                               \
    if (!at::hasCUDA()) GTEST_SKIP() << "needs a CUDA device: libtorch without CUDA, or no GPU here"; \
  } while (0)

/// "Billion laughs" in YAML: nine levels of ten aliases of the level below (1.9 KB, 10^9
/// values expanded): the hostile-input tests' document that must be refused, not expanded.
inline std::string yaml_alias_bomb() {
  std::string y = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int level = 1; level <= 9; ++level) {
    y += "a" + std::to_string(level) + ": &a" + std::to_string(level) + " [";
    for (int i = 0; i < 10; ++i) y += (i ? ", *a" : "*a") + std::to_string(level - 1);
    y += "]\n";
  }
  return y;
}

inline std::string golden_dir() { return MEDFAST_TEST_GOLDEN_DIR; }
inline std::string python() { return MEDFAST_TEST_PYTHON; }
inline std::string source_dir() { return MEDFAST_TEST_SOURCE_DIR; }
inline std::string medfast_binary() { return MEDFAST_TEST_BINARY; }

}  // namespace medfast::test

/// Expects `statement` to throw a ValueError whose message contains `fragment`.
#define EXPECT_VALUE_ERROR(statement, fragment)                                                  \
  do {                                                                                          \
    const std::string message_ = ::medfast::test::value_error_of([&] { (void)(statement); });   \
    EXPECT_NE(message_.find(fragment), std::string::npos) << "message: " << message_;          \
  } while (0)
