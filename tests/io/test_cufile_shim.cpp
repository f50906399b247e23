// The cuFile shim's driver lifetime (issue 21, review finding 10), against a stand-in
// libcufile (fake_cufile.c): it closes with the ref-counted cuFileDriverClose_v2 where the
// library has it (the legacy close would tear cuFile down for kvikio or torch's GDS in the
// same process), with the legacy one where not, once, at exit, without touching a
// destroyed static. Each case runs in a child process: the shim loads once per process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "medfast/core/error.hpp"
#include "medfast/io/file_handle.hpp"
#include "medfast/os/process.hpp"
#include "medfast/shim/cufile.hpp"
#include "host_device.hpp"
#include "io_conformance.hpp"
#include "test_util.hpp"

namespace medfast {
namespace {

std::string env_or(const char* name, const std::string& otherwise) {
  const char* v = std::getenv(name);
  return v ? v : otherwise;
}

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

// The child: the cufile backend against the stand-in that moves bytes (FAKE_CUFILE_IO=1;
// "device" memory is host memory). CHILD_BACKEND names io_backend, CHILD_PATH the device
// path expected; CHILD_FAILS=1: cuFile fails (FAKE_CUFILE_FAIL_AT) and the error must name
// the file and the offset. Run only by the test below.
TEST(CuFileBackend, DISABLED_ChildMovesDeviceMemory) {
  test::TempDir dir;
  const std::string data = io::conformance::random_bytes(300001, 31);
  test::write_file(dir / "f", data);
  const io::IoOptions options = io::IoOptions().set_backend(env_or("CHILD_BACKEND", "cufile"));
  io::FileHandle f = io::FileHandle::open(dir / "f", io::FileHandle::Mode::read, options);
  EXPECT_EQ(f.device_path(), env_or("CHILD_PATH", "?"));
  const bool cufile = f.device_path().rfind("cufile", 0) == 0;
  io::test_device::HostAsDevice device;
  std::string on_device(data.size() - 100, '\0');
  const io::Memory dst = io::Memory::on_device(on_device.data(), on_device.size(), device);
  if (env_or("CHILD_FAILS", "0") == "1") {
    const std::string m = test::error_of<OsError>([&] { f.pread(dst, 100); });
    EXPECT_TRUE(test::contains_all(m, {"cuFileRead of 299901 bytes at offset 100", dir / "f", "failed at offset"})) << m;
    return;
  }
  EXPECT_EQ(f.pread(dst, 100), on_device.size());
  EXPECT_EQ(on_device, data.substr(100));
  EXPECT_EQ(device.stream_waits, cufile ? 1 : 0);  // cuFile runs outside the stream: waited for first
  EXPECT_EQ(device.to_device, cufile ? 0 : 5);     // cuFile: no bounce
  // An observer needs the bytes on the host: the bounce, whatever the backend.
  std::size_t seen = 0;
  EXPECT_EQ(f.pread(dst, 100, [&](const void*, std::size_t n) { seen += n; }), on_device.size());
  EXPECT_EQ(seen, on_device.size());
  // Past the end: short. Host memory: the host half.
  std::string tail(1000, '\0');
  EXPECT_EQ(f.pread(io::Memory::on_device(tail.data(), tail.size(), device), data.size() - 7), 7u);
  EXPECT_EQ(tail.substr(0, 7), data.substr(data.size() - 7));
  EXPECT_EQ(f.read(tail.data(), 10, 5), 10u);
  EXPECT_EQ(tail.substr(0, 10), data.substr(5, 10));
  io::FileHandle w = io::FileHandle::open(dir / "w", io::FileHandle::Mode::write, options);
  w.pwrite(io::Memory::on_device(data.data(), data.size(), device), 0);
  w.write("end", 3, data.size());
  EXPECT_EQ(test::read_file(dir / "w"), data + "end");
}

// The cufile backend by name, and cuFile under io_backend auto where GPUDirect is there
// (the stand-in says so with FAKE_CUFILE_GDS): device memory moves through cuFileRead and
// cuFileWrite, short transfers continued; auto in compatibility mode and a host backend
// by name bounce; a failing transfer names the file and the offset.
TEST(CuFileBackend, DeviceMemoryMovesThroughCuFileWhereChosen) {
  test::TempDir dir;
  const std::string self = os::self_executable();
  struct Case {
    std::string env, backend, path;
    bool through_cufile;
  };
  const Case cases[] = {
      {"FAKE_CUFILE_MAX_IO=65536", "cufile", "cufile (compatibility mode)", true},
      {"FAKE_CUFILE_GDS=1", "auto", "cufile", true},
      {"", "auto", "bounce (pinned host buffers)", false},
      {"FAKE_CUFILE_GDS=1", "posix", "bounce (pinned host buffers)", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.env + " " + c.backend);
    const std::string log = dir / "calls.log";
    std::remove(log.c_str());
    const auto r = test::run("FAKE_CUFILE_IO=1 " + c.env + " FAKE_CUFILE_LOG=" + log +
                             " MEDFAST_CUFILE_LIBRARY=" + MEDFAST_TEST_FAKE_CUFILE + " CHILD_BACKEND=" + c.backend +
                             " CHILD_PATH='" + c.path + "' " + self +
                             " --gtest_also_run_disabled_tests --gtest_filter=CuFileBackend.DISABLED_ChildMovesDeviceMemory");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::string calls = test::read_file(log);
    EXPECT_EQ(calls.find("read\n") != std::string::npos, c.through_cufile) << calls;
    EXPECT_EQ(calls.find("write\n") != std::string::npos, c.through_cufile) << calls;
    if (c.env == "FAKE_CUFILE_MAX_IO=65536") {
      std::size_t reads = 0;
      for (std::size_t at = calls.find("\nread\n"); at != std::string::npos; at = calls.find("\nread\n", at + 1)) ++reads;
      EXPECT_GE(reads, 5u) << "short transfers were not continued: " << calls;
    }
  }
  const auto r = test::run("FAKE_CUFILE_IO=1 FAKE_CUFILE_FAIL_AT=65536 FAKE_CUFILE_MAX_IO=65536 MEDFAST_CUFILE_LIBRARY=" +
                           std::string(MEDFAST_TEST_FAKE_CUFILE) +
                           " CHILD_BACKEND=cufile CHILD_FAILS=1 CHILD_PATH='cufile (compatibility mode)' " + self +
                           " --gtest_also_run_disabled_tests --gtest_filter=CuFileBackend.DISABLED_ChildMovesDeviceMemory");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

}  // namespace
}  // namespace medfast
