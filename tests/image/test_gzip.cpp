#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/image/gzip.hpp"
#include "medfast/os/file.hpp"
#include "test_util.hpp"

namespace medfast::io {
namespace {

std::vector<std::uint8_t> sample(std::size_t n) {
  std::vector<std::uint8_t> v(n);
  std::uint32_t x = 12345;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    v[i] = static_cast<std::uint8_t>((i / 7) ^ (x >> 28));  // compressible, not trivial
  }
  return v;
}

std::vector<std::uint8_t> concat(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  auto r = a;
  r.insert(r.end(), b.begin(), b.end());
  return r;
}

TEST(Gzip, WholeBufferRoundTripAllLevels) {
  const auto data = sample(300000);
  for (int level : {0, 1, 6, 12}) {
    const auto gz = gzip_compress(data.data(), data.size(), level);
    ASSERT_TRUE(is_gzip(gz.data(), gz.size()));
    std::vector<std::uint8_t> out(data.size());
    EXPECT_EQ(gunzip_into(gz.data(), gz.size(), out.data(), out.size(), "mem"), data.size());
    EXPECT_EQ(out, data) << "level " << level;
  }
}

TEST(Gzip, MultiMemberStreamsAreOneStream) {
  const auto a = sample(1000), b = sample(5000);
  const auto gz = concat(gzip_compress(a.data(), a.size(), 6), gzip_compress(b.data(), b.size(), 1));
  std::vector<std::uint8_t> out(6000);
  EXPECT_EQ(gunzip_into(gz.data(), gz.size(), out.data(), out.size(), "mem"), 6000u);
  EXPECT_EQ(std::vector<std::uint8_t>(out.begin(), out.begin() + 1000), a);
  EXPECT_EQ(std::vector<std::uint8_t>(out.begin() + 1000, out.end()), b);
  GzipReader r(gz.data(), gz.size(), "mem");
  std::vector<std::uint8_t> s(7000);
  EXPECT_EQ(r.read(s.data(), s.size()), 6000u);  // short only at the end
  EXPECT_TRUE(std::equal(out.begin(), out.end(), s.begin()));
}

TEST(Gzip, StopsWhereTheCallerNeedsAndAcceptsZeroPadding) {
  const auto data = sample(100000);
  auto gz = gzip_compress(data.data(), data.size(), 6);
  gz.resize(gz.size() + 512, 0);  // zero padding after the last member
  std::vector<std::uint8_t> out(5000);
  EXPECT_EQ(gunzip_into(gz.data(), gz.size(), out.data(), out.size(), "mem"), 5000u);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin()));
  std::vector<std::uint8_t> all(200000);
  EXPECT_EQ(gunzip_into(gz.data(), gz.size(), all.data(), all.size(), "mem"), data.size());
}

// The message of the FormatError that decompressing gz, named case.nii.gz, into out_size
// bytes throws (a test failure where it throws none).
std::string gunzip_error(const std::vector<std::uint8_t>& gz, std::size_t out_size) {
  std::vector<std::uint8_t> out(out_size);
  return test::error_of<FormatError>([&] { gunzip_into(gz.data(), gz.size(), out.data(), out.size(), "case.nii.gz"); });
}

TEST(Gzip, TruncatedStreamIsReportedWithName) {
  const auto data = sample(200000);
  auto gz = gzip_compress(data.data(), data.size(), 6);
  gz.resize(gz.size() / 2);
  EXPECT_TRUE(test::contains_all(gunzip_error(gz, data.size()), {"case.nii.gz", "truncated"}));
}

TEST(Gzip, CorruptStreamIsReportedWithOffset) {
  const auto data = sample(200000);
  auto gz = gzip_compress(data.data(), data.size(), 6);
  for (std::size_t i = 100; i < 140; ++i) gz[i] ^= 0x5a;
  EXPECT_TRUE(test::contains_all(gunzip_error(gz, data.size()), {"case.nii.gz", "corrupt"}));
}

TEST(Gzip, CrcMismatchIsCorruption) {
  const auto data = sample(1000);
  auto gz = gzip_compress(data.data(), data.size(), 6);
  gz[gz.size() - 8] ^= 1;  // CRC32 in the trailer
  std::vector<std::uint8_t> out(data.size());
  EXPECT_THROW(gunzip_into(gz.data(), gz.size(), out.data(), out.size(), "m"), FormatError);
}

// Bytes flipped inside a stored (level 0) deflate block still inflate, into other
// values: only the member's CRC-32 tells. Every path that stops early or falls back to
// zlib must still check it.
std::vector<std::uint8_t> flipped_stored_member(const std::vector<std::uint8_t>& data) {
  auto gz = gzip_compress(data.data(), data.size(), 0);
  for (std::size_t i = gz.size() / 2; i < gz.size() / 2 + 8; ++i) gz[i] ^= 0x5a;  // mid-stream, not the trailer
  return gz;
}

void expect_damage_reported(const std::function<void()>& f, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>(f), {"case.gz", "corrupt"}));
}

TEST(Gzip, FlippedBytesMidStreamAreCaughtByTheCrcOnEveryPath) {
  const auto data = sample(200000);
  const auto gz = flipped_stored_member(data);
  // Whole buffer, the full output asked for (libdeflate refuses it; zlib must not accept it).
  expect_damage_reported(
      [&] {
        std::vector<std::uint8_t> out(data.size());
        gunzip_into(gz.data(), gz.size(), out.data(), out.size(), "case.gz");
      },
      "whole buffer");
  // Whole buffer, only a prefix asked for (past the damage): the rest of the member is
  // decompressed to reach its CRC.
  expect_damage_reported(
      [&] {
        std::vector<std::uint8_t> out(data.size() * 3 / 4);
        gunzip_into(gz.data(), gz.size(), out.data(), out.size(), "case.gz");
      },
      "whole buffer, prefix");
  // Streaming from memory and from a file, stopping early, then finishing the member.
  expect_damage_reported(
      [&] {
        GzipReader r(gz.data(), gz.size(), "case.gz");
        std::vector<std::uint8_t> out(data.size() * 3 / 4);
        r.read(out.data(), out.size());
        r.finish_member();
      },
      "streaming from memory");
  test::TempDir dir;
  test::write_file(dir / "case.gz", std::string(gz.begin(), gz.end()));
  expect_damage_reported(
      [&] {
        const os::File f = os::File::open(dir / "case.gz", os::File::Mode::read);
        GzipReader r(f);
        std::vector<std::uint8_t> out(data.size() * 3 / 4);
        r.read(out.data(), out.size());
        r.finish_member();
      },
      "streaming from a file");
  // gzip(1) agrees that the file is damaged.
  EXPECT_NE(test::run("gzip -t '" + (dir / "case.gz") + "'").exit_code, 0);
  // An undamaged member read in part and finished is fine.
  const auto good = gzip_compress(data.data(), data.size(), 0);
  GzipReader r(good.data(), good.size(), "good.gz");
  std::vector<std::uint8_t> out(1000);
  EXPECT_EQ(r.read(out.data(), out.size()), out.size());
  EXPECT_NO_THROW(r.finish_member());
}

TEST(Gzip, TrailingGarbageIsAnError) {
  const auto data = sample(1000);
  auto gz = gzip_compress(data.data(), data.size(), 6);
  gz.push_back('x');
  gz.push_back('y');
  std::vector<std::uint8_t> out(data.size() + 10);
  EXPECT_THROW(gunzip_into(gz.data(), gz.size(), out.data(), out.size(), "m"), FormatError);
}

TEST(Gzip, FileStreamingMatchesAndParallelWriterRoundTrips) {
  test::TempDir dir;
  const auto data = sample(3 * kGzipMemberBytes / 2 + 12345);  // two data members
  const std::vector<std::uint8_t> head = {'h', 'e', 'a', 'd'};
  {
    os::AtomicWriter w(dir / "x.gz");
    gzip_write(w, {{head.data(), head.size()}, {data.data(), data.size()}}, 1, 2);
    w.commit();
  }
  const os::File f = os::File::open(dir / "x.gz", os::File::Mode::read);
  GzipReader r(f);
  std::vector<std::uint8_t> out(head.size() + data.size() + 100);
  EXPECT_EQ(r.read(out.data(), out.size()), head.size() + data.size());
  EXPECT_TRUE(std::equal(head.begin(), head.end(), out.begin()));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), out.begin() + 4));
  // gzip(1) agrees.
  const auto res = test::run("gzip -t '" + (dir / "x.gz") + "'");
  EXPECT_EQ(res.exit_code, 0) << res.err;
}

}  // namespace
}  // namespace medfast::io
