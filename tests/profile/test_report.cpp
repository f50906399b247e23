// medfast report's page: read from run folders, self-contained, one curve per run
// and metric, bad folders named.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include "medfast/core/error.hpp"
#include "medfast/os/file.hpp"
#include "medfast/profile/report.hpp"
#include "test_util.hpp"

namespace medfast::profile {
namespace {

std::string epoch_line(int epoch, double loss, const char* dice) {
  return str("{\"epoch\":", epoch, ",\"loss\":", loss, ",\"lr\":0.01,\"seconds\":2.0,\"elapsed\":", 2 * epoch,
             ",\"steps\":5,\"samples\":40,\"samples_per_second\":25.5,\"peak_rss_bytes\":", 300 << 20,
             ",\"times\":{\"data_wait\":0.5,\"copy\":0.1,\"forward\":0.4,\"backward\":0.7,\"optimizer\":0.05,"
             "\"validation\":0.2}",
             dice ? str(",\"dice\":", dice, ",\"dice_per_class\":[", dice, ",0.5]") : std::string(), "}\n");
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(Report, OneCurvePerRunAndMetricInASelfContainedPage) {
  test::TempDir dir;
  os::make_directories(dir / "a/profiler");
  os::make_directories(dir / "b<x>");
  test::write_file(dir / "a/metrics.jsonl", epoch_line(1, 1.2, "0.3") + epoch_line(2, 0.9, nullptr) + epoch_line(3, 0.7, "0.6"));
  test::write_file(dir / "a/config.json", "{\"model\": {\"name\": \"UNet\"}}");
  test::write_file(dir / "a/machine.json", "{\"cpu\": \"Test CPU\", \"cores\": 2}");
  test::write_file(dir / "a/profiler/6-trace_summary.txt", "forward  12.5 ms <op>");
  test::write_file(dir / "b<x>/metrics.jsonl", epoch_line(1, 1.5, "0.1") + epoch_line(2, 1.1, "0.2"));
  const std::vector<RunData> runs{read_run(dir / "a"), read_run(dir / "b<x>")};
  EXPECT_EQ(runs[0].epochs.size(), 3u);
  EXPECT_EQ(runs[1].name, "b<x>");
  const std::string html = render_report(runs);
  // Loss, mean Dice, lr, data-wait share, samples/s, memory: one path per run; the
  // per-class Dice of two classes: two dashed paths per run.
  EXPECT_EQ(count(html, "<path class=\"series run-0\""), 6 + 2);
  EXPECT_EQ(count(html, "<path class=\"series run-1\""), 6 + 2);
  EXPECT_EQ(count(html, "stroke-dasharray"), 4);
  EXPECT_EQ(count(html, "<svg class=\"chart stages\""), 2);
  EXPECT_EQ(count(html, "<rect class=\"bar\""), (3 + 2) * 6);
  EXPECT_NE(html.find("b&lt;x&gt;"), std::string::npos) << "names are escaped";
  EXPECT_EQ(html.find("b<x>"), std::string::npos);
  EXPECT_NE(html.find("Test CPU"), std::string::npos);
  EXPECT_NE(html.find("forward  12.5 ms &lt;op&gt;"), std::string::npos);
  EXPECT_NE(html.find("300 MiB"), std::string::npos) << "memory ticks in MiB";
  EXPECT_EQ(html.find("GPU utilisation"), std::string::npos) << "no GPU curves when none were logged";
  // Self-contained: nothing is fetched.
  EXPECT_FALSE(std::regex_search(html, std::regex("(src|href)=\"(https?:)?//")));
  EXPECT_EQ(html.find("<link"), std::string::npos);
  // An epoch without validation is a gap in the Dice curve: two segments (M ... M ...).
  const std::string dice_chart = html.substr(html.find("aria-label=\"validation Dice\""));
  const std::string first_path = dice_chart.substr(dice_chart.find("d=\""), dice_chart.find("\" stroke") - dice_chart.find("d=\""));
  EXPECT_EQ(std::count(first_path.begin(), first_path.end(), 'M'), 2) << first_path;
}

TEST(Report, GpuCurvesWhenLogged) {
  test::TempDir dir;
  os::make_directories(dir / "g");
  test::write_file(dir / "g/metrics.jsonl",
                   "{\"epoch\":1,\"loss\":1,\"lr\":0.1,\"seconds\":1,\"times\":{},\"cuda_peak_allocated_bytes\":1e9,"
                   "\"gpu\":{\"util_mean\":87.5,\"util_max\":99,\"memory_used_max_bytes\":5e9}}\n");
  const std::string html = render_report({read_run(dir / "g")});
  EXPECT_NE(html.find("GPU utilisation"), std::string::npos);
  EXPECT_NE(html.find("CUDA peak allocated"), std::string::npos);
  EXPECT_NE(html.find("GiB"), std::string::npos);
}

TEST(Report, BadRunFoldersAreNamed) {
  test::TempDir dir;
  os::make_directories(dir / "empty");
  const std::string empty = test::error_of<OsError>([&] { read_run(dir / "empty"); });
  EXPECT_NE(empty.find("metrics.jsonl"), std::string::npos) << empty;
  os::make_directories(dir / "bad");
  test::write_file(dir / "bad/metrics.jsonl", epoch_line(1, 1, "0.2") + "{\"epoch\": 2, \"loss\": \n");
  EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] { read_run(dir / "bad"); }),
                                 {dir / "bad/metrics.jsonl", "line 2"}));
  // Records of the wrong types (not as medfast train writes them) are named by file and line.
  for (const std::string& record : {std::string("{\"epoch\": null}"), std::string("{\"epoch\": 1, \"times\": 5}"),
                                    std::string("{\"epoch\": 1, \"times\": {\"forward\": \"slow\"}}")}) {
    test::write_file(dir / "bad/metrics.jsonl", epoch_line(1, 1, "0.2") + record + "\n");
    SCOPED_TRACE(record);
    EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] { render_report({read_run(dir / "bad")}); }),
                                   {dir / "bad/metrics.jsonl", "line 2"}));
  }
  EXPECT_THROW(render_report({}), ValueError);
}

}  // namespace
}  // namespace medfast::profile
