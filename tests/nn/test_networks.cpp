// Networks: parameter counts equal MONAI 1.3.2's (shared/reference), shapes through a forward pass.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "medfast/core/error.hpp"
#include "medfast/nn/unet.hpp"
#include "test_util.hpp"

namespace medfast::nn {
namespace {

nlohmann::json reference() {
  const std::string path = test::source_dir() + "/../shared/reference/monai_param_counts.json";
  const std::string text = test::read_file(path);
  if (text.empty()) throw std::runtime_error("missing " + path);
  return nlohmann::json::parse(text);
}

TEST(Networks, UNetParameterCountsEqualMonai) {
  const auto ref = reference();
  UNetOptions a;  // UNet(3, 1, 2, (16..256), (2,2,2,2), num_res_units=2, norm=BATCH)
  a.num_res_units = 2;
  a.norm = "batch";
  EXPECT_EQ(count_parameters(*UNet(a)),
            ref["UNet(spatial_dims=3,in_channels=1,out_channels=2,channels=(16,32,64,128,256),strides=(2,2,2,2),"
                "num_res_units=2,norm=BATCH)"]
                .get<std::int64_t>());
  UNetOptions b;  // num_res_units=0, norm=INSTANCE
  b.num_res_units = 0;
  b.norm = "instance";
  EXPECT_EQ(count_parameters(*UNet(b)),
            ref["UNet(spatial_dims=3,in_channels=1,out_channels=2,channels=(16,32,64,128,256),strides=(2,2,2,2),"
                "num_res_units=0,norm=INSTANCE)"]
                .get<std::int64_t>());
}

TEST(Networks, UNetForwardKeepsTheSpatialShape) {
  for (int res : {0, 2}) {
    UNetOptions o;
    o.channels = {4, 8, 16};
    o.strides = {2, 2};
    o.num_res_units = res;
    o.norm = res ? "batch" : "instance";
    UNet net(o);
    net->eval();
    torch::NoGradGuard no_grad;
    const auto y = net->forward(torch::rand({2, 1, 16, 24, 8}));
    EXPECT_EQ(y.sizes(), (torch::IntArrayRef{2, 2, 16, 24, 8})) << "num_res_units " << res;
  }
}

TEST(Networks, UNetRejectsBadArguments) {
  UNetOptions o;
  o.strides = {2, 2};
  EXPECT_THROW(UNet{o}, ValueError);
  o = UNetOptions();
  o.norm = "group";
  EXPECT_THROW(UNet{o}, ValueError);
  o = UNetOptions();
  o.kernel_size = 4;
  EXPECT_THROW(UNet{o}, ValueError);
}

}  // namespace
}  // namespace medfast::nn
