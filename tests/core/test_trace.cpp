// core/trace.hpp: ranges recorded from every thread only while tracing is on,
// key averages with self time, and profile/trace_file.hpp's writer and summariser on
// traces whose figures are known exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <thread>

#include "medfast/core/error.hpp"
#include "medfast/core/trace.hpp"
#include "medfast/image/gzip.hpp"
#include "medfast/profile/trace_file.hpp"
#include "medfast/os/file.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

struct Tracing {
  Tracing() {
    trace::clear();
    trace::set_enabled(true);
  }
  ~Tracing() {
    trace::set_enabled(false);
    trace::clear();
  }
};

TEST(Trace, RecordsOnlyWhileOnAndFromEveryThread) {
  trace::clear();
  { trace::Range r("off"); }
  EXPECT_TRUE(trace::collect().empty()) << "a range while tracing is off costs nothing and records nothing";
  Tracing on;
  {
    trace::Range outer("outer");
    outer.arg("step", 3);
    trace::Range cancelled("cancelled");
    cancelled.cancel();
    std::thread t([] {
      trace::set_thread_name("worker");
      trace::Range r("in_thread", "loader");
    });
    t.join();
  }
  trace::counter("gpu_util", 42);
  const auto events = trace::collect();
  ASSERT_EQ(events.size(), 3u);
  std::map<std::string, trace::Event> by_name;
  for (const auto& e : events) by_name[e.name] = e;
  EXPECT_EQ(by_name.count("cancelled"), 0u);
  EXPECT_NE(by_name["outer"].tid, by_name["in_thread"].tid);
  EXPECT_EQ(by_name["in_thread"].category, "loader");
  ASSERT_EQ(by_name["outer"].args.size(), 1u);
  EXPECT_EQ(by_name["outer"].args[0].second, 3.0);
  EXPECT_EQ(by_name["gpu_util"].phase, 'C');
  bool named = false;
  for (const auto& t : trace::threads()) named = named || (t.tid == by_name["in_thread"].tid && t.name == "worker");
  EXPECT_TRUE(named);
  EXPECT_TRUE(trace::collect().empty()) << "collect() empties the buffers";
}

trace::Event span(const std::string& name, std::int64_t ts, std::int64_t dur, std::uint32_t tid = 1,
                  std::vector<std::pair<std::string, double>> args = {}) {
  trace::Event e;
  e.name = name;
  e.category = "medfast";
  e.ts = ts;
  e.dur = dur;
  e.tid = tid;
  e.args = std::move(args);
  return e;
}

TEST(Trace, KeyAveragesTakeChildrenOutOfSelfTime) {
  const std::vector<trace::Event> events{span("step", 0, 1000), span("forward", 100, 300), span("conv", 150, 200),
                                         span("backward", 500, 400), span("step", 2000, 500),
                                         span("forward", 2000, 100), span("load", 0, 50, 2)};
  std::map<std::string, trace::KeyAverage> k;
  for (const auto& r : trace::key_averages(events)) k[r.name] = r;
  EXPECT_EQ(k["step"].count, 2);
  EXPECT_DOUBLE_EQ(k["step"].total_us, 1500);
  EXPECT_DOUBLE_EQ(k["step"].self_us, 1000 - 300 - 400 + 500 - 100);
  EXPECT_DOUBLE_EQ(k["forward"].self_us, 100 + 100);
  EXPECT_DOUBLE_EQ(k["conv"].self_us, 200);
  EXPECT_DOUBLE_EQ(k["load"].self_us, 50);  // another thread: not a child of step
  EXPECT_DOUBLE_EQ(k["step"].max_us, 1000);
  const std::string table = trace::key_averages_table(events);
  EXPECT_NE(table.find("By self time"), std::string::npos);
  EXPECT_NE(table.find("backward"), std::string::npos);
}

TEST(TraceFile, WritesGzipChromeTraceAndSummarisesMedfastSteps) {
  test::TempDir dir;
  // Two epochs of 3 steps: data_wait (the first of each epoch long), forward, backward.
  std::vector<trace::Event> events;
  std::int64_t t = 0;
  for (int epoch = 1; epoch <= 2; ++epoch) {
    for (int step = 1; step <= 3; ++step) {
      const std::int64_t wait = step == 1 ? 5000 : 1000 * step, fwd = 2000 + step * 100, bwd = 4000;
      events.push_back(span("step", t, wait + fwd + bwd + 100, 1, {{"epoch", epoch}, {"step", step}}));
      events.push_back(span("data_wait", t, wait));
      events.push_back(span("forward", t + wait, fwd));
      events.push_back(span("backward", t + wait + fwd, bwd));
      events.push_back(span("batch", t, 700, 2));
      t += wait + fwd + bwd + 100;
    }
  }
  const std::string path = dir / "7-trace.json.gz";
  profile::write_chrome_trace(path, events, {{1, "main"}, {2, "loader 0"}}, {{"run_dir", "x"}});
  const nlohmann::json j = profile::read_trace_json(path);
  ASSERT_TRUE(j.contains("traceEvents"));
  EXPECT_EQ(j["otherData"]["run_dir"], "x");
  int names = 0;
  for (const auto& e : j["traceEvents"]) names += e["ph"] == "M" && e["name"] == "thread_name";
  EXPECT_EQ(names, 2);

  const profile::TraceSummary s = profile::summarize_trace(path);
  EXPECT_EQ(s.producer, "medfast");
  EXPECT_EQ(s.steps, 6u);
  EXPECT_EQ(s.stats.at("first_load").count, 2u);
  EXPECT_DOUBLE_EQ(s.stats.at("first_load").mean, 5.0);
  EXPECT_EQ(s.stats.at("batch_load").count, 4u);
  EXPECT_DOUBLE_EQ(s.stats.at("batch_load").min, 2.0);
  EXPECT_DOUBLE_EQ(s.stats.at("batch_load").max, 3.0);
  EXPECT_DOUBLE_EQ(s.stats.at("batch_load").median, 2.5);
  EXPECT_EQ(s.stats.at("forward").count, 6u);
  EXPECT_DOUBLE_EQ(s.stats.at("forward").median, 2.2);
  EXPECT_DOUBLE_EQ(s.stats.at("forward").p95, 2.3);
  EXPECT_DOUBLE_EQ(s.stats.at("backward").mean, 4.0);
  const std::string text = s.to_text();
  EXPECT_NE(text.find("first_load"), std::string::npos);
  EXPECT_EQ(s.to_json()["step"]["count"], 6);
}

TEST(TraceFile, BadTracesAreFormatErrorsNamingTheFile) {
  test::TempDir dir;
  auto expect = [&](const std::string& name, const std::string& text, const std::string& what) {
    const std::string path = dir / name;
    {
      os::AtomicWriter w(path);
      w.append(text.data(), text.size());
      w.commit();
    }
    EXPECT_TRUE(test::contains_all(test::error_of<FormatError>([&] { profile::summarize_trace(path); }), {path, what}));
  };
  expect("garbage.json", "{not json", "not a JSON trace");
  expect("object.json", "{\"events\": []}", "not a Chrome trace");
  expect("nosteps.json", "[{\"name\": \"x\", \"ph\": \"X\", \"ts\": 1, \"dur\": 2}]", "no steps");
  expect("badts.json", "[{\"name\": \"x\", \"ph\": \"X\", \"ts\": \"soon\"}]", "ts");
  const std::string gz = dir / "cut.json.gz";
  {
    const std::string text = "{\"traceEvents\": []}";
    const auto packed = gzip_compress(text.data(), text.size(), 6);
    os::AtomicWriter w(gz);
    w.append(packed.data(), packed.size() - 6);  // cut short
    w.commit();
  }
  EXPECT_THROW(profile::summarize_trace(gz), FormatError);
}

// Traces written by python3-torch's profiler (torch 1.13 here: the legacy profiler's
// bare list; Kineto's object elsewhere), with and without a user "forward" range.
TEST(TraceFile, SummarisesTorchProfilerTraces) {
  test::TempDir dir;
  for (const bool user : {false, true}) {
    const std::string path = dir / (user ? "user.json" : "plain.json");
    const auto r = test::run(str(MEDFAST_TEST_PYTHON, " ", MEDFAST_TEST_SOURCE_DIR, "/tests/golden/make_torch_trace.py ",
                                 path, user ? " --user-ranges" : "", " --epochs 2 --steps-per-epoch 3"));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const profile::TraceSummary s = profile::summarize_trace(path);
    EXPECT_EQ(s.producer, "torch.profiler");
    EXPECT_EQ(s.steps, 6u) << r.out;
    // The first step's load and the second epoch's first load; the other four steps' loads.
    EXPECT_EQ(s.stats.at("first_load").count, 2u);
    EXPECT_EQ(s.stats.at("batch_load").count, 4u);
    EXPECT_EQ(s.stats.at("forward").count, 6u);
    EXPECT_EQ(s.stats.at("backward").count, 6u);
    EXPECT_GT(s.stats.at("forward").min, 0.0);
    EXPECT_GT(s.stats.at("backward").min, 0.0);
    EXPECT_LE(s.stats.at("forward").mean + s.stats.at("backward").mean, s.stats.at("step").mean);
    if (user) {
      // forward is the user range itself: the same durations the trace holds for it.
      const nlohmann::json j = profile::read_trace_json(path);
      const nlohmann::json& ev = j.is_array() ? j : j["traceEvents"];
      std::vector<double> fwd;
      for (const auto& e : ev) {
        if (e.value("name", "") == "forward" && e.value("ph", "") == "X") fwd.push_back(e["dur"].get<double>() / 1e3);
      }
      ASSERT_EQ(fwd.size(), 6u);
      EXPECT_DOUBLE_EQ(s.stats.at("forward").max, *std::max_element(fwd.begin(), fwd.end()));
    }
  }
}

}  // namespace
}  // namespace medfast
