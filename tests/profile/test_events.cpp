// TensorBoard event files: CRC-32C against its published check values, and files that an
// independent reader (tests/golden/read_tfevents.py: its own bitwise CRC, a generic
// protobuf walker) reads back record by record.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"
#include "medfast/profile/events.hpp"
#include "profile/tfevents_reader.hpp"
#include "test_util.hpp"

namespace medfast::profile {
namespace {

TEST(Events, Crc32cMatchesItsCheckValues) {
  // RFC 3720 B.4 and the CRC catalogue's check value.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[static_cast<std::size_t>(i)] = static_cast<char>(i);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  // Incremental use equals one pass.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
}

TEST(Events, AFileIsReadBackByAnIndependentReader) {
  test::TempDir dir;
  std::string path;
  {
    EventWriter w(dir.path());
    path = w.path();
    EXPECT_TRUE(is_event_file(path.substr(path.rfind('/') + 1))) << path;
    EXPECT_NE(path.find(".medfast"), std::string::npos);
    w.scalar("train_loss", 0.75, 1, 1700000000.25);
    w.scalar("train_loss", 0.5, 2, 1700000001.5);
    w.scalar("val_dice/class_1", 0.125, 1, 1700000002.0);
    w.scalar("big_step", -3.5, std::int64_t{1} << 40, 1.0);
    w.scalar("negative_step", 1e30, -7, 2.0);
    w.scalar("nan", std::nan(""), 3, 3.0);
    w.flush();
    w.scalar("not_flushed", 1.0, 9, 4.0);  // gone with the writer: a flush is the unit of durability
  }
  const nlohmann::json j = test::read_tfevents(dir.path());
  ASSERT_EQ(j["files"].size(), 1u) << j.dump();
  const auto& f = j["files"][0];
  EXPECT_EQ(f["version"], "brain.Event:2");
  EXPECT_EQ(f["records"], 7);  // the version record and six scalars
  const auto& s = f["scalars"];
  ASSERT_EQ(s.size(), 6u) << f.dump();
  const nlohmann::json expected = nlohmann::json::parse(R"([
    ["train_loss", 1, 0.75, 1700000000.25], ["train_loss", 2, 0.5, 1700000001.5],
    ["val_dice/class_1", 1, 0.125, 1700000002.0], ["big_step", 1099511627776, -3.5, 1.0],
    ["negative_step", -7, 1e30, 2.0], ["nan", 3, null, 3.0]])");
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(s[i][0], expected[i][0]);
    EXPECT_EQ(s[i][1], expected[i][1]) << s[i].dump();
    EXPECT_EQ(s[i][3].get<double>(), expected[i][3].get<double>()) << s[i].dump();
    if (expected[i][2].is_null()) {  // NaN (JSON has none)
      EXPECT_TRUE(s[i][2].is_null()) << s[i].dump();
    } else {  // simple_value is a float
      EXPECT_EQ(s[i][2].get<double>(), static_cast<double>(static_cast<float>(expected[i][2].get<double>())))
          << s[i].dump();
    }
  }
  if (j["tensorboard"].is_string()) {
    std::printf("[ note ] tensorboard's EventAccumulator check %s\n", j["tensorboard"].get<std::string>().c_str());
  } else {
    EXPECT_EQ(j["tensorboard"]["train_loss"].dump(), "[[1,0.75],[2,0.5]]");
    EXPECT_EQ(j["tensorboard"]["val_dice/class_1"].dump(), "[[1,0.125]]");
  }
}

TEST(Events, TheReaderRefusesADamagedRecord) {
  // The independent reader really checks both CRCs: one byte changed in a payload or in a
  // length makes it fail naming the record.
  test::TempDir dir;
  std::string path;
  {
    EventWriter w(dir.path());
    path = w.path();
    w.scalar("train_loss", 0.75, 1, 2.0);
    w.flush();
  }
  const std::string good = test::read_file(path);
  const std::size_t second = tfrecord(encode_version_event(2.0)).size();  // where record 2 starts
  ASSERT_GT(good.size(), second + 16);
  for (const std::size_t at : {good.size() - 6 /* its payload */, second + 1 /* its length */}) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x01);
    test::write_file(path, bad);
    const auto r = test::run(str(test::python(), " ", test::source_dir(), "/tests/golden/read_tfevents.py '", path, "'"));
    EXPECT_EQ(r.exit_code, 1) << "byte " << at << ": " << r.out;
    EXPECT_NE(r.err.find("record 2"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("CRC"), std::string::npos) << r.err;
  }
}

TEST(Events, SecondWriterInTheSameSecondTakesTheNextName) {
  test::TempDir dir;
  EventWriter a(dir.path()), b(dir.path());
  EXPECT_NE(a.path(), b.path());
  EXPECT_LT(a.path(), b.path());  // TensorBoard reads a folder's files in name order
  EXPECT_EQ(os::list_directory(dir.path()).size(), 2u);
}

TEST(Events, AnUnwritableFolderIsAnErrorNamingThePath) {
  const std::string m = test::error_of<Error>([] { EventWriter w("/nonexistent-medfast-folder"); });
  EXPECT_NE(m.find("/nonexistent-medfast-folder/events.out.tfevents."), std::string::npos) << m;
}

}  // namespace
}  // namespace medfast::profile
