// Networks: parameter counts equal MONAI 1.3.2's (tests/reference), shapes through a forward pass.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "medfast/core/error.hpp"
#include "medfast/core/fields.hpp"
#include "medfast/nn/dynunet.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/nn/segresnet.hpp"
#include "medfast/nn/swin_unetr.hpp"
#include "medfast/nn/unet.hpp"
#include "backend_check.hpp"
#include "test_util.hpp"

namespace medfast::nn {
namespace {

nlohmann::json reference() {
  const std::string path = test::source_dir() + "/tests/reference/monai_param_counts.json";
  const std::string text = test::read_file(path);
  if (text.empty()) throw std::runtime_error("missing " + path);
  return nlohmann::json::parse(text);
}

TEST(Networks, UNetParameterCountsEqualMonai) {
  const auto ref = reference();
  // UNet(3, 1, 2, (16..256), (2,2,2,2)) with the residual units and norm given.
  const auto expect_count = [&](int num_res_units, UNetNorm norm, const std::string& monai_args) {
    UNetOptions o;
    o.num_res_units = num_res_units;
    o.norm = norm;
    const std::string key =
        "UNet(spatial_dims=3,in_channels=1,out_channels=2,channels=(16,32,64,128,256),strides=(2,2,2,2)," + monai_args +
        ")";
    EXPECT_EQ(count_parameters(*UNet(o)), ref[key].get<std::int64_t>()) << key;
  };
  expect_count(2, UNetNorm::batch, "num_res_units=2,norm=BATCH");
  expect_count(0, UNetNorm::instance, "num_res_units=0,norm=INSTANCE");
}

TEST(Networks, UNetForwardKeepsTheSpatialShape) {
  for (int res : {0, 2}) {
    UNetOptions o;
    o.channels = {4, 8, 16};
    o.strides = {2, 2};
    o.num_res_units = res;
    o.norm = res ? UNetNorm::batch : UNetNorm::instance;
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
  o.kernel_size = 4;
  EXPECT_THROW(UNet{o}, ValueError);
}

// ---------------------------------------------------------------------------------------------
// SegResNet and SwinUNETR

const char* const kSegResNet16 =
    "SegResNet(spatial_dims=3,init_filters=16,in_channels=4,out_channels=3,blocks_down=(1,2,2,4),blocks_up=(1,1,1),"
    "dropout_prob=0.2)";
const char* const kSegResNet8 =
    "SegResNet(spatial_dims=3,init_filters=8,in_channels=1,out_channels=2,blocks_down=(1,2,2,4),blocks_up=(1,1,1))";
const char* const kSwinV1 =
    "SwinUNETR(img_size=(96,96,96),in_channels=1,out_channels=2,feature_size=48,depths=(2,2,2,2),num_heads=(3,6,12,24),"
    "use_v2=False)";
const char* const kSwinV2 =
    "SwinUNETR(img_size=(96,96,96),in_channels=1,out_channels=2,feature_size=48,depths=(2,2,2,2),num_heads=(3,6,12,24),"
    "use_v2=True)";

/// The message of the ValueError that reading the network arguments `json` throws.
std::string parse_error(const char* json) {
  return test::value_error_of([&] { parse_network(nlohmann::json::parse(json)); });
}

bool has_name(const torch::nn::Module& m, const std::string& name) {
  for (const auto& p : m.named_parameters()) {
    if (p.key() == name) return true;
  }
  return false;
}

TEST(Networks, SegResNetParameterCountsEqualMonai) {
  const auto ref = reference();
  SegResNetOptions a;
  a.init_filters = 16;
  a.in_channels = 4;
  a.out_channels = 3;
  a.dropout_prob = 0.2;
  EXPECT_EQ(count_parameters(*SegResNet(a)), ref[kSegResNet16].get<std::int64_t>());
  EXPECT_EQ(count_parameters(*SegResNet(SegResNetOptions())), ref[kSegResNet8].get<std::int64_t>());
}

TEST(Networks, SegResNetNamesItsParametersAsMonai) {
  SegResNetOptions o;
  o.upsample_mode = UpsampleMode::deconv;
  SegResNet net(o);
  for (const char* name :
       {"convInit.conv.weight", "down_layers.0.1.norm1.weight", "down_layers.0.1.conv2.conv.weight",
        "down_layers.1.0.conv.weight", "up_layers.2.0.conv1.conv.weight", "up_samples.0.0.conv.weight",
        "up_samples.0.1.deconv.weight", "conv_final.0.weight", "conv_final.2.conv.bias"}) {
    EXPECT_TRUE(has_name(*net, name)) << name;
  }
  // A deconv adds (c/2)^2 * 8 weights + c/2 biases per level over the trilinear default.
  std::int64_t extra = 0;
  for (std::int64_t c : {64, 32, 16}) extra += (c / 2) * (c / 2) * 8 + c / 2;
  EXPECT_EQ(count_parameters(*net), count_parameters(*SegResNet(SegResNetOptions())) + extra);
}

TEST(Networks, SegResNetForwardKeepsTheSpatialShape) {
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  for (const UpsampleMode mode : {UpsampleMode::nontrainable, UpsampleMode::deconv}) {
    SegResNetOptions o;
    o.upsample_mode = mode;
    SegResNet net(o);
    net->eval();
    const auto y = net->forward(torch::rand({1, 1, 32, 32, 32}));
    EXPECT_EQ(y.sizes(), (torch::IntArrayRef{1, 2, 32, 32, 32})) << name_of(mode);
    EXPECT_TRUE(torch::isfinite(y).all().item<bool>()) << name_of(mode);
  }
  SegResNetOptions o;
  o.in_channels = 2;
  o.out_channels = 3;
  SegResNet net(o);
  net->eval();
  EXPECT_EQ(net->forward(torch::rand({2, 2, 16, 24, 8})).sizes(), (torch::IntArrayRef{2, 3, 16, 24, 8}));
  // 8 = 2^(4 levels - 1) must divide every spatial size.
  EXPECT_NE(test::value_error_of([&] {
              net->forward(torch::rand({1, 2, 16, 20, 8}));
            }).find("divisible by 8"),
            std::string::npos);
}

TEST(Networks, SegResNetRejectsBadArguments) {
  auto bad = [](auto edit) {
    SegResNetOptions o;
    edit(o);
    return test::value_error_of([&] { SegResNet{o}; });
  };
  EXPECT_NE(bad([](auto& o) { o.blocks_up = {1, 1}; }).find("blocks_up"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.blocks_down = {}; }).find("blocks_down"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.num_groups = 3; }).find("num_groups 3"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.dropout_prob = 1.0; }).find("dropout_prob"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.spatial_dims = 2; }).find("spatial_dims"), std::string::npos);
  // Names outside a closed set stop at the reader, which lists the names.
  EXPECT_NE(parse_error(R"({"name": "SegResNet", "norm": "layer"})").find("model: argument norm: 'layer' is not one of group | batch | instance"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"name": "SegResNet", "upsample_mode": "pixelshuffle"})")
                .find("model: argument upsample_mode: 'pixelshuffle' is not one of nontrainable | deconv"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"name": "SegResNet", "act": "gelu"})").find("model: argument act: 'gelu' is not one of relu | leakyrelu"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"name": "UNet", "norm": "group"})").find("model: argument norm: 'group' is not one of instance | batch | none"),
            std::string::npos);
}

// DynUNet (nnU-Net's network; its outputs and names against MONAI: test_monai_parity.cpp).
TEST(Networks, DynUNetShapesDeepSupervisionAndInitialWeights) {
  DynUNetOptions o;
  o.kernel_size = nlohmann::json::parse("[[3, 3, 1], 3, 3]");
  o.strides = nlohmann::json::parse("[1, [2, 2, 1], 2]");
  o.upsample_kernel_size = nlohmann::json::parse("[[2, 2, 1], 2]");
  o.filters = {4, 8, 16, 99};  // extra entries are ignored, as MONAI's
  o.out_channels = 3;
  o.deep_supervision = true;
  o.deep_supr_num = 1;
  o.res_block = true;
  DynUNet net(o);
  const at::Tensor x = torch::randn({2, 1, 16, 12, 8});
  net->train();
  const at::Tensor stacked = net->forward(x);
  EXPECT_EQ(stacked.sizes().vec(), (std::vector<std::int64_t>{2, 2, 3, 16, 12, 8}));  // the output and one head
  net->eval();
  EXPECT_EQ(net->forward(x).sizes().vec(), (std::vector<std::int64_t>{2, 3, 16, 12, 8}));
  // Sizes the strides do not divide are named with the divisor.
  const std::string odd = test::value_error_of([&] { net->forward(torch::randn({1, 1, 16, 12, 7})); });
  EXPECT_NE(odd.find("divisible"), std::string::npos) << odd;
  EXPECT_NE(odd.find("2 along axis 2"), std::string::npos) << odd;  // z strides 1, 1, 2
  // MONAI's initial weights: Kaiming normal (a = 0.01) convolutions, zero biases.
  const auto params = net->named_parameters();
  const at::Tensor w = params["bottleneck.conv2.conv.weight"];  // 16 x 16 x 3 x 3 x 3: fan_in 432
  EXPECT_NEAR(w.std().item<double>(), std::sqrt(2.0 / (1 + 1e-4) / 432), 0.006);
  EXPECT_TRUE(params["output_block.conv.conv.bias"].eq(0).all().item<bool>());
  // One tensor under two names, as MONAI's skip_layers: libtorch lists it twice, training
  // and counting take each once (MONAI's count for this network: 21668, from the peer).
  EXPECT_TRUE(params["input_block.conv1.conv.weight"].is_same(params["skip_layers.downsample.conv1.conv.weight"]));
  EXPECT_GT(net->parameters().size(), unique_tensors(net->parameters()).size());
  DynUNetOptions m;
  m.kernel_size = nlohmann::json::parse("[3, 3, 3]");
  m.strides = nlohmann::json::parse("[1, 2, 2]");
  m.upsample_kernel_size = nlohmann::json::parse("[2, 2]");
  m.filters = {4, 8, 16};
  m.deep_supervision = true;
  m.res_block = true;
  EXPECT_EQ(count_parameters(*DynUNet(m)), 21668);
  // nnU-Net's filters by default: min(32 * 2^level, 320).
  DynUNetOptions d;
  d.kernel_size = nlohmann::json::parse("[3, 3, 3, 3, 3, 3, 3]");
  d.strides = nlohmann::json::parse("[1, 2, 2, 2, 2, 2, 2]");
  d.upsample_kernel_size = nlohmann::json::parse("[2, 2, 2, 2, 2, 2]");
  EXPECT_EQ(d.level_filters(), (std::vector<std::int64_t>{32, 64, 128, 256, 320, 320, 320}));
  // Loss weights: 1 / 2^i normalised; nnU-Net's lowest decoder output (just above the
  // bottleneck) dropped where the stack reaches it.
  const auto weights = deep_supervision_weights(3, false);
  ASSERT_EQ(weights.size(), 3u);
  EXPECT_NEAR(weights[0], 4.0 / 7, 1e-12);
  EXPECT_NEAR(weights[1], 2.0 / 7, 1e-12);
  EXPECT_NEAR(weights[2], 1.0 / 7, 1e-12);
  // 5 levels: 2 heads stop above the lowest decoder level; 3 reach it (nnU-Net's K = 4 outputs).
  EXPECT_EQ(parse_network(nlohmann::json::parse(R"({"name": "DynUNet", "deep_supervision": true, "deep_supr_num": 2})"))
                .deep_supervision_weights,
            (std::vector<double>{4.0 / 7, 2.0 / 7, 1.0 / 7}));
  const auto all = parse_network(nlohmann::json::parse(R"({"name": "DynUNet", "deep_supervision": true, "deep_supr_num": 3})"))
                       .deep_supervision_weights;
  ASSERT_EQ(all.size(), 4u);
  EXPECT_NEAR(all[0], 8.0 / 14, 1e-12);
  EXPECT_NEAR(all[2], 2.0 / 14, 1e-12);
  EXPECT_EQ(all[3], 0.0);
  EXPECT_TRUE(parse_network(nlohmann::json::parse(R"({"name": "DynUNet"})")).deep_supervision_weights.empty());
}

TEST(Networks, DynUNetRejectsBadArguments) {
  auto bad = [](auto edit) {
    DynUNetOptions o;
    edit(o);
    return test::value_error_of([&] { DynUNet{o}; });
  };
  EXPECT_NE(bad([](auto& o) { o.kernel_size = nlohmann::json::parse("[3, 3]"); o.strides = nlohmann::json::parse("[1, 2]"); })
                .find("at least 3"),
            std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.strides = nlohmann::json::parse("[1, 2, 2, 2]"); }).find("same length"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.upsample_kernel_size = nlohmann::json::parse("[2, 2]"); }).find("upsample_kernel_size has 2"),
            std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.kernel_size = nlohmann::json::parse("[3, [3, 3], 3, 3, 3]"); }).find("kernel_size[1]"),
            std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.strides = nlohmann::json::parse("[1, 0, 2, 2, 2]"); }).find("strides[1] 0 must be >= 1"),
            std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.kernel_size = nlohmann::json::parse("[1, 3, 3, 3, 3]"); o.strides = nlohmann::json::parse("[3, 2, 2, 2, 2]"); })
                .find("negative padding"),
            std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.filters = {8, 16}; }).find("filters has 2"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.deep_supervision = true; o.deep_supr_num = 4; }).find("deep_supr_num 4"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.dropout = 1.5; }).find("dropout"), std::string::npos);
  const std::string norm = parse_error(R"({"name": "DynUNet", "norm_name": "group"})");
  EXPECT_NE(norm.find("norm_name: 'group' is not one of instance | batch"), std::string::npos) << norm;
}

TEST(Networks, SwinUNETRParameterCountsEqualMonai) {
  const auto ref = reference();
  SwinUNETROptions o;  // img 96^3, in 1, out 2, feature 48, depths (2,2,2,2), heads (3,6,12,24)
  EXPECT_EQ(count_parameters(*SwinUNETR(o)), ref[kSwinV1].get<std::int64_t>());
  o.use_v2 = true;
  EXPECT_EQ(count_parameters(*SwinUNETR(o)), ref[kSwinV2].get<std::int64_t>());
}

TEST(Networks, SwinUNETRNamesItsParametersAsMonai) {
  SwinUNETROptions o;
  o.feature_size = 12;
  o.use_v2 = true;
  SwinUNETR net(o);
  for (const char* name :
       {"swinViT.patch_embed.proj.weight", "swinViT.layers1.0.blocks.0.norm1.weight",
        "swinViT.layers1.0.blocks.1.attn.relative_position_bias_table", "swinViT.layers2.0.blocks.1.attn.qkv.bias",
        "swinViT.layers4.0.blocks.1.mlp.linear2.weight", "swinViT.layers3.0.downsample.reduction.weight",
        "swinViT.layers3.0.downsample.norm.bias", "swinViT.layers1c.0.layer.conv1.conv.weight",
        "encoder1.layer.conv3.conv.weight", "encoder10.layer.conv2.conv.weight", "decoder5.transp_conv.conv.weight",
        "decoder1.conv_block.conv3.conv.weight", "out.conv.conv.bias"}) {
    EXPECT_TRUE(has_name(*net, name)) << name;
  }
  // The bias table covers (2*7-1)^3 offsets; the index puts offset 0 at (6*13 + 6)*13 + 6.
  for (const auto& b : net->named_buffers()) {
    if (b.key() != "swinViT.layers1.0.blocks.0.attn.relative_position_index") continue;
    const auto& index = b.value();
    ASSERT_EQ(index.sizes(), (torch::IntArrayRef{343, 343}));
    EXPECT_EQ(index[0][0].item<std::int64_t>(), 1098);
    EXPECT_EQ(index[0][342].item<std::int64_t>(), 0);     // j - i = (6, 6, 6)
    EXPECT_EQ(index[342][0].item<std::int64_t>(), 2196);  // j - i = (-6, -6, -6)
    EXPECT_EQ(index[1][0].item<std::int64_t>(), 1099);    // j - i = (0, 0, -1)
  }
}

TEST(Networks, SwinUNETRForwardKeepsTheSpatialShape) {
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  for (bool v2 : {false, true}) {
    SwinUNETROptions o;
    o.img_size = {32, 32, 32};
    o.feature_size = 12;
    o.use_v2 = v2;
    o.downsample = v2 ? SwinDownsample::mergingv2 : SwinDownsample::merging;
    SwinUNETR net(o);
    net->eval();
    // 32^3: stages see 16^3 (window 7, padded to 21, shifted), 8^3 (padded to 14, shifted),
    // then 4^3 and 2^3, smaller than the window: it shrinks to the input, unshifted.
    auto y = net->forward(torch::rand({1, 1, 32, 32, 32}));
    EXPECT_EQ(y.sizes(), (torch::IntArrayRef{1, 2, 32, 32, 32})) << "v2 " << v2;
    EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
    if (v2) continue;  // (keeps the test short; the stages are shared)
    // Non-cubic: at 4x8x4 the window is (4, 7, 4) with a shift only along H.
    y = net->forward(torch::rand({1, 1, 32, 64, 32}));
    EXPECT_EQ(y.sizes(), (torch::IntArrayRef{1, 2, 32, 64, 32})) << "v2 " << v2;
    EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  }
}

TEST(Networks, SwinUNETRIsDeterministicAndIndependentOfTheBatch) {
  torch::manual_seed(1);
  torch::NoGradGuard no_grad;
  SwinUNETROptions o;
  o.img_size = {32, 32, 32};
  o.feature_size = 12;
  SwinUNETR net(o);
  net->eval();
  const auto x = torch::randn({2, 1, 32, 32, 32});  // shifted stages at 16^3 and 8^3
  const auto y = net->forward(x);
  // Each sample's windows and shift masks are its own: the second sample of a batch (whose
  // windows follow the first's) gives what it gives alone.
  const auto alone = net->forward(x.slice(0, 1, 2));
  EXPECT_TRUE(torch::allclose(y.slice(0, 1, 2), alone, 1e-4, 1e-5));
  EXPECT_FALSE(torch::allclose(y.slice(0, 0, 1), alone, 1e-4, 1e-5));  // and the samples differ
  EXPECT_TRUE(torch::equal(alone, net->forward(x.slice(0, 1, 2)))) << "not deterministic";
}

TEST(Networks, SwinUNETRRejectsBadArguments) {
  auto bad = [](auto edit) {
    SwinUNETROptions o;
    edit(o);
    return test::value_error_of([&] { SwinUNETR{o}; });
  };
  EXPECT_NE(bad([](auto& o) { o.img_size = {96, 96, 80}; }).find("img_size entry 80"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.img_size = {96, 96}; }).find("img_size"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.feature_size = 40; }).find("feature_size 40"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.depths = {2, 2, 2}; }).find("depths"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.num_heads = {3, 6, 12, 25}; }).find("num_heads"), std::string::npos);
  EXPECT_NE(bad([](auto& o) { o.attn_drop_rate = 1.5; }).find("attn_drop_rate"), std::string::npos);
  EXPECT_NE(parse_error(R"({"name": "SwinUNETR", "norm_name": "group"})")
                .find("model: argument norm_name: 'group' is not one of instance | batch"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"name": "SwinUNETR", "downsample": "pool"})")
                .find("model: argument downsample: 'pool' is not one of merging | mergingv2"),
            std::string::npos);
  SwinUNETROptions o;
  o.img_size = {32, 32, 32};
  o.feature_size = 12;
  SwinUNETR net(o);
  EXPECT_NE(test::value_error_of([&] {
              net->forward(torch::rand({1, 1, 32, 48, 32}));
            }).find("divisible by 32"),
            std::string::npos);
}

// Straightforward reference: per window, head and query, softmax over keys of q.k/sqrt(d) + bias.
TEST(Networks, WindowAttentionEqualsTheDefinition) {
  torch::manual_seed(2);
  const std::int64_t windows = 6, nw = 3, heads = 2, n = 5, d = 4;
  const auto q = torch::randn({windows, heads, n, d}, torch::kDouble);
  const auto k = torch::randn({windows, heads, n, d}, torch::kDouble);
  const auto v = torch::randn({windows, heads, n, d}, torch::kDouble);
  // Relative-position-like bias plus a shift mask that separates voxels {0, 1} from {2, 3, 4}
  // in the second window of each sample.
  auto bias = torch::randn({nw, heads, n, n}, torch::kDouble);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if ((i < 2) != (j < 2)) bias[1].select(1, i).select(1, j).sub_(100.0);
    }
  }
  auto expected = torch::zeros_like(q);
  for (std::int64_t w = 0; w < windows; ++w) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t i = 0; i < n; ++i) {
        std::vector<double> p(n);
        double total = 0;
        for (std::int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (std::int64_t c = 0; c < d; ++c) s += q[w][h][i][c].item<double>() * k[w][h][j][c].item<double>();
          p[j] = std::exp(s / std::sqrt(double(d)) + bias[w % nw][h][i][j].item<double>());
          total += p[j];
        }
        for (std::int64_t j = 0; j < n; ++j) expected[w][h][i].add_(v[w][h][j] * (p[j] / total));
      }
    }
  }
  const auto plain = detail::window_attention_plain(q, k, v, bias, 0.0, false);
  EXPECT_TRUE(torch::allclose(plain, expected, 1e-9, 1e-12));
  // Masked pairs get (numerically) no weight: in window 1 query 0 sees only keys 0 and 1.
  const auto only01 = detail::window_attention_plain(q.slice(0, 1, 2).slice(2, 0, 2), k.slice(0, 1, 2).slice(2, 0, 2),
                                                     v.slice(0, 1, 2).slice(2, 0, 2),
                                                     bias.slice(0, 1, 2).slice(2, 0, 2).slice(3, 0, 2), 0.0, false);
  EXPECT_TRUE(torch::allclose(plain.slice(0, 1, 2).slice(2, 0, 2), only01, 1e-9, 1e-30));
  // The dispatching entry point (fused where libtorch has it) agrees with the plain path.
  const auto used = detail::window_attention(q.to(torch::kFloat), k.to(torch::kFloat), v.to(torch::kFloat),
                                             bias.to(torch::kFloat), 0.0, false);
  EXPECT_TRUE(torch::allclose(used.to(torch::kDouble), expected, 1e-4, 1e-5))
      << (detail::has_fused_attention() ? "fused" : "plain");
}

// MONAI's compute_mask on a 4^3 volume, window 2, shift 1: the cyclic shift puts coordinates
// 2 and 3 of each axis (regions [-2:-1] and [-1:]) into the last window along that axis.
TEST(Networks, ShiftedWindowMaskSeparatesTheRegionsAShiftBringsTogether) {
  const auto mask = detail::shifted_window_mask({4, 4, 4}, {2, 2, 2}, {1, 1, 1}, torch::kCPU);
  ASSERT_EQ(mask.sizes(), (torch::IntArrayRef{8, 8, 8}));
  // Window (d, h, w) = (0, 0, 0) lies in one region: no masking.
  EXPECT_TRUE(torch::equal(mask[0], torch::zeros({8, 8})));
  // Window (1, 1, 1): every voxel is its own region.
  const auto eye = torch::eye(8);
  EXPECT_TRUE(torch::equal(mask[7], (1 - eye) * -100.0));
  // Window (0, 0, 1): voxels share a region iff they share the w coordinate (the last bit).
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(mask[1][i][j].item<float>(), (i % 2 == j % 2) ? 0.0f : -100.0f) << i << "," << j;
    }
  }
  // An unshifted axis (MONAI's shift 0 where the window covers the input) does not split regions.
  const auto flat = detail::shifted_window_mask({4, 4, 2}, {2, 2, 2}, {1, 1, 0}, torch::kCPU);
  ASSERT_EQ(flat.sizes(), (torch::IntArrayRef{4, 8, 8}));
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      // Window (1, 1): voxels share a region iff they share (d, h), i.e. i / 2 == j / 2.
      EXPECT_EQ(flat[3][i][j].item<float>(), (i / 2 == j / 2) ? 0.0f : -100.0f) << i << "," << j;
    }
  }
}

TEST(Networks, FactoryBuildsSegResNetAndSwinUNETRByName) {
  const auto ref = reference();
  auto seg = make_network(nlohmann::json::parse(
      R"({"name": "SegResNet", "init_filters": 16, "in_channels": 4, "out_channels": 3, "dropout_prob": 0.2,
          "norm": "GROUP", "num_groups": 8, "blocks_down": [1, 2, 2, 4], "blocks_up": [1, 1, 1]})"));
  EXPECT_EQ(count_parameters(*seg.ptr()), ref[kSegResNet16].get<std::int64_t>());
  auto swin = make_network(nlohmann::json::parse(
      R"({"name": "SwinUNETR", "img_size": [96, 96, 96], "in_channels": 1, "out_channels": 2, "feature_size": 48,
          "depths": [2, 2, 2, 2], "num_heads": [3, 6, 12, 24], "use_v2": true})"));
  EXPECT_EQ(count_parameters(*swin.ptr()), ref[kSwinV2].get<std::int64_t>());
  // An int img_size is repeated (MONAI's ensure_tuple_rep); the network runs through AnyModule.
  auto small = make_network(nlohmann::json::parse(R"({"name": "SwinUNETR", "img_size": 32, "feature_size": 12})"));
  small.ptr()->eval();
  torch::NoGradGuard no_grad;
  EXPECT_EQ(small.forward(torch::rand({1, 1, 32, 32, 32})).sizes(), (torch::IntArrayRef{1, 2, 32, 32, 32}));
}

TEST(Networks, FactoryRejectsUnknownAndBadArguments) {
  auto msg = [](const char* text) {
    return test::value_error_of([&] { make_network(nlohmann::json::parse(text), "cfg.yaml: model"); });
  };
  EXPECT_NE(msg(R"({"name": "SegResNet", "filters": 8})").find("unknown argument 'filters'"), std::string::npos);
  EXPECT_NE(msg(R"({"name": "SwinUNETR", "window_size": 7})").find("unknown argument 'window_size'"),
            std::string::npos);
  const std::string img = msg(R"({"name": "SwinUNETR", "img_size": [96, 96, 90]})");
  EXPECT_NE(img.find("cfg.yaml: model"), std::string::npos) << img;
  EXPECT_NE(img.find("img_size"), std::string::npos) << img;
  EXPECT_NE(msg(R"({"name": "SegResNet", "upsample_mode": "pixelshuffle"})").find("upsample_mode"), std::string::npos);
  EXPECT_NE(msg(R"({"name": "SegResNet", "blocks_down": "many"})").find("blocks_down"), std::string::npos);
}

// One declaration per argument (fields()): what a model section is read into is
// written back whole, defaults included, and reads back to the same arguments.
template <typename Options>
void expect_written_back_whole(const std::string& name) {
  const NetworkSpec spec = parse_network({{"name", name}}, "model");
  EXPECT_EQ(spec.name, name);
  EXPECT_EQ(spec.arguments, fields_json(Options{})) << name << ": every argument, at its default";
  std::vector<std::string> keys;
  for (const auto& [k, v] : spec.arguments.items()) keys.push_back(k);
  auto declared = field_keys<Options>();
  std::sort(declared.begin(), declared.end());
  EXPECT_EQ(keys, declared) << name;
  nlohmann::json again = spec.arguments;
  again["name"] = name;
  EXPECT_EQ(parse_network(again, "model").arguments, spec.arguments) << name << ": written back, read again";
  for (const auto& row : field_docs<Options>()) {
    EXPECT_FALSE(row.help.empty()) << name << "." << row.key << " has no help line";
    EXPECT_EQ(nlohmann::json::parse(row.default_value), spec.arguments.at(row.key)) << name << "." << row.key;
  }
}

TEST(Networks, EachNetworkTakesMonaisArgumentNames) {
  // Spelled out here (not from fields()): a member left out of a field list would
  // otherwise become an unknown argument unnoticed.
  auto keys = [](const std::string& name) {
    const NetworkSpec spec = parse_network({{"name", name}});  // outlives the loop over its items
    std::vector<std::string> k;
    for (const auto& [key, v] : spec.arguments.items()) k.push_back(key);
    return k;
  };
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(keys("UNet"), sorted({"spatial_dims", "in_channels", "out_channels", "channels", "strides", "kernel_size",
                                  "up_kernel_size", "num_res_units", "norm", "dropout"}));
  EXPECT_EQ(keys("SegResNet"),
            sorted({"spatial_dims", "init_filters", "in_channels", "out_channels", "dropout_prob", "act", "norm",
                    "num_groups", "blocks_down", "blocks_up", "upsample_mode"}));
  EXPECT_EQ(keys("SwinUNETR"),
            sorted({"img_size", "in_channels", "out_channels", "depths", "num_heads", "feature_size", "norm_name",
                    "drop_rate", "attn_drop_rate", "dropout_path_rate", "normalize", "spatial_dims", "downsample",
                    "use_v2"}));
  EXPECT_EQ(keys("DynUNet"),
            sorted({"spatial_dims", "in_channels", "out_channels", "kernel_size", "strides", "upsample_kernel_size",
                    "filters", "dropout", "norm_name", "deep_supervision", "deep_supr_num", "res_block",
                    "trans_bias"}));
  const NetworkSpec seg = parse_network(
      nlohmann::json::parse(R"({"name": "SegResNet", "act": "LeakyReLU", "upsample_mode": "DeConv", "out_channels": 4})"));
  EXPECT_EQ(seg.arguments["act"], "leakyrelu");
  EXPECT_EQ(seg.arguments["upsample_mode"], "deconv");
  EXPECT_EQ(output_channels(seg), 4);
  EXPECT_EQ(parse_network(nlohmann::json::parse(R"({"name": "SwinUNETR", "downsample": "MergingV2"})"))
                .arguments["downsample"],
            "mergingv2");
  // img_size: one whole number stands for three; anything else must be a list.
  const std::string half = parse_error(R"({"name": "SwinUNETR", "img_size": 96.5})");
  EXPECT_NE(half.find("img_size: expected a list of whole numbers"), std::string::npos) << half;
  const std::string whole_float = parse_error(R"({"name": "SwinUNETR", "img_size": 96.0})");
  EXPECT_NE(whole_float.find("img_size: expected a list"), std::string::npos) << whole_float;
}

TEST(Networks, ArgumentsAreWrittenBackWholeFromOneDeclaration) {
  expect_written_back_whole<UNetOptions>("UNet");
  expect_written_back_whole<SegResNetOptions>("SegResNet");
  expect_written_back_whole<SwinUNETROptions>("SwinUNETR");
  expect_written_back_whole<DynUNetOptions>("DynUNet");
  EXPECT_EQ(network_names(), (std::vector<std::string>{"UNet", "SegResNet", "SwinUNETR", "DynUNet"}));
  const NetworkSpec swin = parse_network(
      nlohmann::json::parse(R"({"name": "SwinUNETR", "img_size": 64, "norm_name": "BATCH", "out_channels": 3})"));
  EXPECT_EQ(swin.arguments["img_size"], nlohmann::json::parse("[64, 64, 64]"));  // one number stands for three
  EXPECT_EQ(swin.arguments["norm_name"], "batch");                               // names compare lowercase
  EXPECT_EQ(swin.arguments["out_channels"], 3);
  const NetworkSpec unet = parse_network(nlohmann::json::parse(R"({"name": "UNet", "norm": "Batch"})"));
  EXPECT_EQ(unet.arguments["norm"], "batch");
  EXPECT_EQ(count_parameters(*unet.build().ptr()), count_parameters(*make_network(nlohmann::json::parse(
                                                                         R"({"name": "UNet", "norm": "batch"})"))
                                                                         .ptr()));
  const std::string unknown =
      test::value_error_of([] { parse_network(nlohmann::json::parse(R"({"name": "VNet"})"), "m"); });
  EXPECT_NE(unknown.find("unknown network 'VNet' (expected UNet, SegResNet, SwinUNETR or DynUNet)"), std::string::npos)
      << unknown;
}

}  // namespace
}  // namespace medfast::nn
