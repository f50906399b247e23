#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>
#include <sstream>

#include "medfast/core/error.hpp"
#include "medfast/core/settings.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

TEST(Settings, DefaultsComeFromTheNamedConstants) {
  Settings s;
  EXPECT_EQ(s.get_int("gzip_level"), kDefaultGzipLevel);
  EXPECT_EQ(s.get_int("threads"), kDefaultThreads);
  EXPECT_EQ(s.get_bytes("max_volume_bytes"), kDefaultMaxVolumeBytes);
  EXPECT_EQ(s.get_bytes("gzip_buffer_limit"), kDefaultGzipBufferLimit);
  EXPECT_EQ(s.entry("gzip_level").source, SettingSource::default_value);
  EXPECT_GE(s.threads(), 1);  // 0 resolves to the core count
}

// docs/settings.md's table has one row per setting, under its name, and no other rows: the
// table a user reads is the list the code declares (a setting added without a row fails).
TEST(Settings, DocsTableHasARowForEverySettingAndNoOther) {
  const std::string readme = test::read_file(test::source_dir() + "/docs/settings.md");
  const std::size_t begin = readme.find("\n| setting | default |");
  ASSERT_NE(begin, std::string::npos) << "docs/settings.md has no settings table";
  const std::size_t end = readme.find("\n\n", readme.find("\n|", begin) + 1);
  std::set<std::string> rows;
  std::istringstream table(readme.substr(begin, end - begin));
  for (std::string line; std::getline(table, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    const std::size_t close = line.find('`', 3);
    ASSERT_NE(close, std::string::npos) << line;
    rows.insert(line.substr(3, close - 3));
  }
  std::set<std::string> names;
  for (const SettingDef& d : setting_defs()) names.insert(d.name);
  for (const auto& n : names) EXPECT_TRUE(rows.count(n)) << n << ": no row in docs/settings.md's table";
  for (const auto& r : rows) EXPECT_TRUE(names.count(r)) << r << ": a docs/settings.md row for no setting";
}

TEST(Settings, PrecedenceIsFlagThenEnvThenFileThenDefault) {
  Settings s;
  s.set("gzip_level", "3", SettingSource::file, "cfg.yaml");
  EXPECT_EQ(s.get("gzip_level"), "3");
  s.set("gzip_level", "4", SettingSource::env, "MEDFAST_GZIP_LEVEL");
  EXPECT_EQ(s.get("gzip_level"), "4");
  s.set("gzip_level", "9", SettingSource::flag, "--gzip-level");
  EXPECT_EQ(s.get("gzip_level"), "9");
  // A lower-precedence source arriving later does not override.
  s.set("gzip_level", "1", SettingSource::env, "MEDFAST_GZIP_LEVEL");
  s.set("gzip_level", "2", SettingSource::file, "cfg.yaml");
  EXPECT_EQ(s.get("gzip_level"), "9");
  EXPECT_EQ(s.entry("gzip_level").source, SettingSource::flag);
  EXPECT_EQ(s.entry("gzip_level").origin, "--gzip-level");
}

TEST(Settings, EnvironmentVariablesAreRead) {
  ::setenv("MEDFAST_GZIP_LEVEL", "11", 1);
  Settings s;
  s.load_env();
  ::unsetenv("MEDFAST_GZIP_LEVEL");
  EXPECT_EQ(s.get_int("gzip_level"), 11);
  EXPECT_EQ(s.entry("gzip_level").origin, "MEDFAST_GZIP_LEVEL");
}

TEST(Settings, BadValuesNameTheSettingValueSourceAndRange) {
  Settings s;
  const std::string m =
      test::value_error_of([&] { s.set("gzip_level", "13", SettingSource::env, "MEDFAST_GZIP_LEVEL"); });
  EXPECT_TRUE(test::contains_all(m, {"gzip_level", "'13'", "MEDFAST_GZIP_LEVEL", "0..12"}));
  EXPECT_THROW(s.set("log_level", "loud", SettingSource::flag), ValueError);
  EXPECT_THROW(s.set("max_volume_bytes", "12 parsecs", SettingSource::flag), ValueError);
  EXPECT_THROW(s.set("no_such_setting", "1", SettingSource::flag), ValueError);
  EXPECT_EQ(s.get_int("gzip_level"), kDefaultGzipLevel);  // unchanged after the failures
}

TEST(Settings, FileSettingsAreReadAndCheckedByKey) {
  test::TempDir dir;
  test::write_file(dir / "ok.yaml", "settings:\n  gzip_level: 2\n  max_volume_bytes: 1GiB\n");
  Settings s;
  load_settings_text(s, test::read_file(dir / "ok.yaml"), dir / "ok.yaml");
  EXPECT_EQ(s.get_int("gzip_level"), 2);
  EXPECT_EQ(s.get_bytes("max_volume_bytes"), 1ull << 30);
  EXPECT_EQ(s.entry("gzip_level").source, SettingSource::file);

  test::write_file(dir / "bad.yaml", "settings:\n  gzip_levle: 2\n");
  Settings t;
  const std::string m =
      test::error_of<Error>([&] { load_settings_text(t, test::read_file(dir / "bad.yaml"), dir / "bad.yaml"); });
  EXPECT_TRUE(test::contains_all(m, {"bad.yaml", "gzip_levle"}));
  test::write_file(dir / "broken.yaml", "settings: [1, 2\n");
  Settings u;
  EXPECT_THROW(load_settings_text(u, test::read_file(dir / "broken.yaml"), dir / "broken.yaml"), FormatError);
}

TEST(Settings, EveryDeclaredSettingHasEnvFlagAndDescription) {
  for (const auto& d : setting_defs()) {
    EXPECT_EQ(d.env_var().rfind("MEDFAST_", 0), 0u);
    EXPECT_EQ(d.flag().rfind("--", 0), 0u);
    EXPECT_FALSE(d.description.empty()) << d.name;
  }
}

}  // namespace
}  // namespace medfast
