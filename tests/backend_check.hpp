#pragma once
// What every program that runs networks does before its first forward (nn/self_check.hpp):
// the network tests run on checked math too. On a machine whose oneDNN computes garbage
// (docs/compat.md) the check switches it off here, as `medfast train` would, and the
// network goldens then test medfast rather than the faulty kernels. MEDFAST_SELF_CHECK=off
// skips it, as everywhere.
#include <gtest/gtest.h>

#include "medfast/core/settings.hpp"
#include "medfast/train/self_check.hpp"

namespace medfast::test {

class BackendCheckEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    Settings s;
    s.load_env();
    train::ensure_backends_checked(c10::Device(c10::kCPU), at::kFloat, s.get_bool("self_check"));
  }
};

inline ::testing::Environment* const kBackendCheck =
    ::testing::AddGlobalTestEnvironment(new BackendCheckEnvironment);

}  // namespace medfast::test
