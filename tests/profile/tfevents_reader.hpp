#pragma once
// What tests/golden/read_tfevents.py (an independent TensorBoard event file reader) reads
// from a folder or a file, and the scalars of one tag across a folder's files.

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "test_util.hpp"

namespace medfast::test {

/// read_tfevents.py's JSON for `target`; fails the test (and returns null) when it cannot read it.
inline nlohmann::json read_tfevents(const std::string& target) {
  const auto r = run(str(python(), " ", source_dir(), "/tests/golden/read_tfevents.py '", target, "'"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

/// (step, value) of every `tag` scalar over all files, in file then record order (NaN: null).
inline std::vector<std::pair<std::int64_t, nlohmann::json>> scalars_of(const nlohmann::json& events,
                                                                        const std::string& tag) {
  std::vector<std::pair<std::int64_t, nlohmann::json>> out;
  if (!events.contains("files")) return out;
  for (const auto& f : events["files"]) {
    for (const auto& s : f["scalars"]) {
      if (s[0] == tag) out.emplace_back(s[1].get<std::int64_t>(), s[2]);
    }
  }
  return out;
}

}  // namespace medfast::test
