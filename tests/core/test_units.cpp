#include <gtest/gtest.h>

#include <cstdlib>

#include "medfast/core/error.hpp"
#include "medfast/core/random.hpp"
#include "medfast/core/units.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

TEST(Units, ParseBytes) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("4K"), 4096u);
  EXPECT_EQ(parse_bytes("4KiB"), 4096u);
  EXPECT_EQ(parse_bytes("1MiB"), 1u << 20);
  EXPECT_EQ(parse_bytes("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_bytes("2GB"), 2000000000ull);
  EXPECT_THROW(parse_bytes("12 parsecs"), ValueError);
  EXPECT_THROW(parse_bytes("MiB"), ValueError);
  EXPECT_THROW(parse_bytes(""), ValueError);
}

TEST(Units, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3ull << 30), "3.00 GiB");
}

TEST(Units, ParseNumbersNameWhatWasParsed) {
  EXPECT_EQ(parse_int("-12", "x"), -12);
  const std::string m = test::value_error_of([] { parse_int("12a", "--cases"); });
  EXPECT_NE(m.find("--cases"), std::string::npos) << m;
  EXPECT_DOUBLE_EQ(parse_double("0.25", "x"), 0.25);
  EXPECT_THROW(parse_double("nan", "x"), ValueError);
}

TEST(Units, FormatNumberIsShortAndRoundTrips) {
  EXPECT_EQ(format_number(300), "300");
  EXPECT_EQ(format_number(42.5), "42.5");
  EXPECT_EQ(format_number(0.1), "0.1");
  EXPECT_EQ(format_number(-7), "-7");
  EXPECT_EQ(format_number(1e20), "1e+20");
  for (const double v : {1.0 / 3, 2.0 / 7, 1e-9, 123456.789, 6.02214076e23}) {
    EXPECT_EQ(std::strtod(format_number(v).c_str(), nullptr), v) << format_number(v);
  }
}

TEST(Random, StreamsAreReproducibleAndSeedDependent) {
  Rng a(derive_seed({1, 2, 3})), b(derive_seed({1, 2, 3})), c(derive_seed({1, 2, 4}));
  for (int i = 0; i < 100; ++i) {
    const auto x = a.next();
    EXPECT_EQ(x, b.next());
    if (i == 0) {
      EXPECT_NE(x, c.next());
    }
  }
  Rng r(7);
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double v = r.normal();
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
}

}  // namespace
}  // namespace medfast
