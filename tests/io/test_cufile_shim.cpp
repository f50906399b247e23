// The cuFile shim's driver lifetime (issue 21, review finding 10), against a stand-in
// libcufile (fake_cufile.c): it closes with the ref-counted cuFileDriverClose_v2 where the
// library has it (the legacy close would tear cuFile down for kvikio or torch's GDS in the
// same process), with the legacy one where not, once, at exit, without touching a
// destroyed static. Each case runs in a child process: the shim loads once per process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "medfast/os/process.hpp"
#include "medfast/shim/cufile.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

// The child: loads the library MEDFAST_CUFILE_LIBRARY names and exits normally. Run only
// by the test below (disabled in a normal run).
TEST(CuFileShim, DISABLED_ChildLoadsTheDriverAndExits) {
  std::string why;
  const shim::CuFileApi* api = shim::cufile(&why);
  ASSERT_NE(api, nullptr) << why;
  EXPECT_TRUE(api->compat_mode);  // the stand-in reports no nvidia-fs properties
}

TEST(CuFileShim, ClosesTheDriverOnceAtExitRefCountedWhereItCan) {
  test::TempDir dir;
  const std::string self = os::self_executable();
  for (const auto& [lib, want] : {std::pair<std::string, std::string>{MEDFAST_TEST_FAKE_CUFILE, "open\nclose_v2\n"},
                                  {MEDFAST_TEST_FAKE_CUFILE_LEGACY, "open\nclose\n"}}) {
    SCOPED_TRACE(lib);
    const std::string log = dir / "calls.log";
    std::remove(log.c_str());
    const auto r = test::run("FAKE_CUFILE_LOG=" + log + " MEDFAST_CUFILE_LIBRARY=" + lib + " " + self +
                             " --gtest_also_run_disabled_tests --gtest_filter=CuFileShim.DISABLED_ChildLoadsTheDriverAndExits");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(test::read_file(log), want);
  }
}

}  // namespace
}  // namespace medfast
