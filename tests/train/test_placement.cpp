// Where a run computes (train/placement.hpp): auto's choice and its reason, the names it
// refuses, what a run says of its device, and the built-in default recipe per device.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "medfast/core/error.hpp"
#include "medfast/io/tensor_io.hpp"
#include "medfast/train/placement.hpp"
#include "medfast/train/run_config.hpp"
#include "test_util.hpp"

namespace medfast::train {
namespace {

TEST(Placement, AutoTakesAGpuWhereOneIsUsableAndSaysWhy) {
  const DeviceChoice a = choose_device("auto", "train.device");
  EXPECT_EQ(a.device, io::resolve_device("auto"));  // the one rule, below train/ too
  if (!cuda_build()) {
    EXPECT_TRUE(a.device.is_cpu());
    EXPECT_EQ(a.text.rfind("cpu: this build has no CUDA (libtorch ", 0), 0u) << a.text;
  } else if (!at::hasCUDA()) {
    EXPECT_TRUE(a.device.is_cpu());
    EXPECT_EQ(a.text.rfind("cpu: no GPU visible", 0), 0u) << a.text;
  } else {
    EXPECT_TRUE(a.device.is_cuda());
    EXPECT_TRUE(a.device.has_index());
    EXPECT_NE(a.text.find(" (") , std::string::npos) << a.text;  // the GPU's name
    EXPECT_NE(a.text.find(", sm_"), std::string::npos) << a.text;
  }
  const DeviceChoice cpu = choose_device("cpu", "--device");
  EXPECT_TRUE(cpu.device.is_cpu());
  EXPECT_EQ(cpu.text, "cpu (--device cpu)");
  const std::string bad = test::error_of<ValueError>([] { choose_device("gpu", "train.device"); });
  EXPECT_NE(bad.find("train.device"), std::string::npos) << bad;
  EXPECT_NE(bad.find("'gpu'"), std::string::npos) << bad;
  if (!at::hasCUDA()) {
    const std::string none = test::error_of<ValueError>([] { choose_device("cuda", "train.device"); });
    EXPECT_NE(none.find("no usable CUDA device"), std::string::npos) << none;
  }
  // What a run writes of it: the versions, a GPU's name and capability where there is one.
  const nlohmann::json info = runtime_info(a.device);
  EXPECT_FALSE(info["libtorch"].get<std::string>().empty());
  EXPECT_EQ(info["cuda"].is_null(), !cuda_build() || !at::hasCUDA() ? info["cuda"].is_null() : false);
  EXPECT_EQ(info.contains("gpu"), a.device.is_cuda());
  const std::string words = runtime_text(info);
  EXPECT_EQ(words.rfind("libtorch ", 0), 0u) << words;
  if (info["cuda"].is_null()) EXPECT_NE(words.find("no CUDA"), std::string::npos) << words;
}

// The built-in default recipe: the CPU's settings on the CPU (fp32, the memory cache); a
// GPU's on a GPU (bf16 where it computes it, else fp16; the device cache); train.device auto.
TEST(Placement, TheDefaultRecipeTakesTheSettingsOfItsDevice) {
  const nlohmann::json cpu = default_run_config();
  EXPECT_EQ(cpu["train"]["device"], "auto");
  EXPECT_EQ(cpu["train"]["amp"], false);
  EXPECT_EQ(cpu["data"]["cache"]["kind"], "memory");
  EXPECT_EQ(default_run_config(c10::Device("cpu"), true), cpu);
  const nlohmann::json ampere = default_run_config(c10::Device("cuda:0"), true);
  EXPECT_EQ(ampere["train"]["amp"], "bf16");
  EXPECT_EQ(ampere["data"]["cache"]["kind"], "device");
  EXPECT_EQ(ampere["train"]["device"], "auto");
  EXPECT_EQ(default_run_config(c10::Device("cuda:0"), false)["train"]["amp"], "fp16");
  // Everything else is the same run: the data, the network, the loss, the target.
  for (const char* k : {"model", "loss", "optimizer", "validation"}) EXPECT_EQ(ampere[k], cpu[k]) << k;
  EXPECT_EQ(ampere["train"]["target_dice"], cpu["train"]["target_dice"]);
}

}  // namespace
}  // namespace medfast::train
