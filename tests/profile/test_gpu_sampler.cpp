// The GPU sampler over the NVML shim (suite NvmlSampler: no GPU needed, so not "Gpu"), against a fake libnvidia-ml built with the
// tests (tests/profile/fake_nvml.c): readings, epoch statistics, trace counters,
// and the one clear reason when NVML or a GPU cannot be had.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <thread>

#include "medfast/core/trace.hpp"
#include "medfast/profile/gpu_sampler.hpp"

namespace medfast::profile {
namespace {

using namespace std::chrono_literals;

struct FakeNvml {
  FakeNvml() { ::setenv("MEDFAST_NVML_LIBRARY", MEDFAST_TEST_FAKE_NVML, 1); }
  ~FakeNvml() {
    ::unsetenv("MEDFAST_NVML_LIBRARY");
    ::unsetenv("FAKE_NVML_INIT_FAIL");
    ::unsetenv("FAKE_NVML_READ_FAIL");
  }
};

TEST(NvmlSampler, EpochStatisticsFromTheReadings) {
  FakeNvml fake;
  std::string why;
  trace::clear();
  trace::set_enabled(true);
  auto s = GpuSampler::start({{"00000000:3B:00.0", 0}, {"", 1}}, 5ms, why);
  ASSERT_TRUE(s) << why;
  std::this_thread::sleep_for(150ms);
  const GpuEpochStats e = s->take();
  trace::set_enabled(false);
  EXPECT_GE(e.samples, 6u);  // both GPUs, several periods
  EXPECT_GE(e.util_mean, 50.0);
  EXPECT_LE(e.util_mean, 60.0);
  EXPECT_EQ(e.util_max, 60.0);
  EXPECT_EQ(e.memory_used_max_bytes, 1ull << 30);
  EXPECT_EQ(e.temperature_max_c, 65.0);
  EXPECT_GT(e.power_mean_w, 0.0);  // GPU 1 reports no power: its readings count as 0 W
  EXPECT_LT(e.power_mean_w, 150.0);
  const nlohmann::json j = e.to_json();
  EXPECT_EQ(j["memory_used_max_bytes"], 1ull << 30);
  EXPECT_TRUE(j.contains("util_mean") && j.contains("power_mean_w") && j.contains("temperature_max_c"));
  // The next epoch starts afresh.
  std::this_thread::sleep_for(30ms);
  EXPECT_LT(s->take().samples, e.samples);
  int counters = 0;
  for (const auto& ev : trace::collect()) counters += ev.phase == 'C' && ev.name == "gpu0 util %";
  EXPECT_GT(counters, 2) << "readings are counter tracks while tracing";
  EXPECT_EQ(s->error(), "");
}

TEST(NvmlSampler, UnavailableNvmlOrGpuIsOneClearReason) {
  FakeNvml fake;
  std::string why;
  ::setenv("FAKE_NVML_INIT_FAIL", "1", 1);
  EXPECT_FALSE(GpuSampler::start({{"", 0}}, 5ms, why));
  EXPECT_NE(why.find("nvmlInit failed"), std::string::npos) << why;
  EXPECT_NE(why.find("FAKE init failure"), std::string::npos) << why;
  ::unsetenv("FAKE_NVML_INIT_FAIL");
  EXPECT_FALSE(GpuSampler::start({{"00000000:AF:00.0", 0}}, 5ms, why));
  EXPECT_NE(why.find("00000000:AF:00.0"), std::string::npos) << why;
  EXPECT_FALSE(GpuSampler::start({{"", 7}}, 5ms, why));
  EXPECT_NE(why.find("index 7"), std::string::npos) << why;
  ::setenv("FAKE_NVML_READ_FAIL", "1", 1);
  EXPECT_FALSE(GpuSampler::start({{"", 0}}, 5ms, why));
  EXPECT_NE(why.find("nvmlDeviceGetUtilizationRates"), std::string::npos) << why;
  ::setenv("MEDFAST_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  EXPECT_FALSE(GpuSampler::start({{"", 0}}, 5ms, why));
  EXPECT_NE(why.find("/nonexistent/libnvidia-ml.so.1 could not be loaded"), std::string::npos) << why;
}

}  // namespace
}  // namespace medfast::profile
