// NVTX: medfast's ranges reach an NVTX tool (a fake injection library built with
// the tests, standing in for Nsight Systems) as push/pop pairs, only while NVTX is on.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "medfast/core/trace.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

TEST(TraceNvtx, RangesReachAnInjectedToolAsPushPop) {
#ifndef MEDFAST_TEST_FAKE_NVTX
  EXPECT_FALSE(trace::nvtx_available());
  GTEST_SKIP() << "built without the CUDA toolkit's NVTX3 headers: set_nvtx is a no-op";
#else
  ASSERT_TRUE(trace::nvtx_available());
  test::TempDir dir;
  const std::string log = dir / "nvtx.log";
  // Read by NVTX3 at its first call in this process (ctest runs each test alone).
  ::setenv("NVTX_INJECTION64_PATH", MEDFAST_TEST_FAKE_NVTX, 1);
  ::setenv("FAKE_NVTX_LOG", log.c_str(), 1);
  { trace::Range before("before"); }  // NVTX off: nothing
  trace::set_nvtx(true);
  {
    trace::Range outer("outer");
    trace::Range inner(std::string("inner"), "transform");
    inner.cancel();  // cancelling drops the trace event, never half an NVTX pair
  }
  trace::set_nvtx(false);
  { trace::Range after("after"); }
  EXPECT_EQ(test::read_file(log), "push outer\npush inner\npop\npop\n");
  EXPECT_TRUE(trace::collect().empty()) << "NVTX alone records nothing into the trace";
#endif
}

}  // namespace
}  // namespace medfast
