// A graceful stop (os::stop_on_first_signal): the first SIGINT or SIGTERM is caught and kept,
// and the second ends the process at once (the default action), whatever it was doing.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "medfast/os/process.hpp"

namespace medfast::os {
namespace {

TEST(OsProcess, TheFirstStopSignalIsKeptAndTheSecondEndsTheProcess) {
  for (const int first : {SIGINT, SIGTERM}) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      stop_on_first_signal();
      if (stop_signal() != 0) ::_exit(10);
      ::raise(first);  // caught: the process goes on
      if (stop_signal() != first) ::_exit(11);
      ::raise(SIGINT);  // the second: the default action
      ::_exit(12);      // not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "exited " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    EXPECT_EQ(WTERMSIG(status), SIGINT);
  }
}

}  // namespace
}  // namespace medfast::os
