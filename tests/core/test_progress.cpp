// core/progress.hpp: the live line on a terminal, plain periodic lines otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "medfast/core/progress.hpp"

namespace medfast {
namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

TEST(Progress, LineHasCountPercentRateAndEta) {
  EXPECT_EQ(Progress::line("cache build", 30, 120, "items", 10.0, ""), "cache build  30/120   25%  3.00 items/s  ETA 0:30  0:10");
  EXPECT_EQ(Progress::line("epoch 2/5", 5, 5, "steps", 2.0, "loss 0.4100"), "epoch 2/5  5/5  100%  2.50 steps/s  0:02  loss 0.4100");
  EXPECT_EQ(Progress::line("eval", 0, 3, "cases", 0.0, ""), "eval  0/3    0%  0:00");
  EXPECT_EQ(Progress::line("infer", 50, 100, "files", 3600.0 * 2, ""),
            "infer  50/100   50%  0.01 files/s  ETA 2:00:00  2:00:00");
}

TEST(Progress, TtyRewritesOneLineAndEndsIt) {
  std::FILE* f = std::tmpfile();
  {
    Progress p("cache build", 3, "items", Progress::Style::tty, f);
    p.update(1);
    p.update(2);  // within 100 ms of the last: skipped
    p.update(3);  // the last item is always shown
    p.finish();
  }
  const std::string s = contents(f);
  EXPECT_EQ(s.rfind("\rcache build  1/3", 0), 0u) << s;
  EXPECT_EQ(s.find("2/3"), std::string::npos) << s;
  EXPECT_NE(s.find("\rcache build  3/3  100%"), std::string::npos) << s;
  EXPECT_EQ(s.back(), '\n');
  std::fclose(f);
}

TEST(Progress, ClearErasesAndPrintAboveKeepsTheLiveLine) {
  std::FILE* f = std::tmpfile();
  std::FILE* g = std::tmpfile();
  Progress p("eval", 4, "cases", Progress::Style::tty, f);
  p.update(1);
  const std::string first = contents(f).substr(1);  // without the leading \r
  std::fseek(f, 0, SEEK_END);
  p.print_above("case 1 done", g);
  EXPECT_EQ(contents(g), "case 1 done\n");
  std::fseek(f, 0, SEEK_END);
  p.finish(/*clear=*/true);
  const std::string s = contents(f);
  const std::string blank(first.size(), ' ');
  EXPECT_EQ(s, "\r" + first + "\r" + blank + "\r" + first + "\r" + blank + "\r");
  std::fclose(f);
  std::fclose(g);
}

TEST(Progress, PlainPrintsOneLinePerPeriodAndNothingForShortWork) {
  std::FILE* f = std::tmpfile();
  {
    Progress p("epoch 1/1", 100, "steps", Progress::Style::plain, f, /*every_seconds=*/30);
    for (std::size_t i = 1; i <= 100; ++i) p.update(i);
  }
  EXPECT_EQ(contents(f), "") << "short work prints no progress lines";
  std::FILE* g = std::tmpfile();
  {
    Progress p("epoch 1/1", 2, "steps", Progress::Style::plain, g, /*every_seconds=*/0.01);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    p.update(1, "loss 1.0");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    p.update(2);
  }
  const std::string s = contents(g);
  EXPECT_EQ(s.find('\r'), std::string::npos);
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 2) << s;
  EXPECT_NE(s.find("epoch 1/1  1/2   50%"), std::string::npos) << s;
  EXPECT_NE(s.find("loss 1.0"), std::string::npos) << s;
  std::fclose(f);
  std::fclose(g);
}

TEST(Progress, OffPrintsNothingAndStyleFollowsTheSetting) {
  std::FILE* f = std::tmpfile();
  {
    Progress p("x", 1, "items", Progress::Style::off, f);
    p.update(1);
  }
  EXPECT_EQ(contents(f), "");
  EXPECT_EQ(Progress::style_from("off", f), Progress::Style::off);
  EXPECT_EQ(Progress::style_from("tty", f), Progress::Style::tty);
  EXPECT_EQ(Progress::style_from("plain", f), Progress::Style::plain);
  EXPECT_EQ(Progress::style_from("auto", f), Progress::Style::plain) << "a file is not a terminal";
  std::fclose(f);
}

}  // namespace
}  // namespace medfast
