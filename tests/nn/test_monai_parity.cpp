// Golden parity with MONAI 1.3.2's networks (issue 11, item 4) and model.pretrained (item 5).
//
// tests/reference/monai_networks.json holds, per network, MONAI's arguments, its state_dict's
// names and shapes, and its forward output on a formula input with every floating-point
// parameter set by a formula of the MONAI name and element index (tests/golden/monai_formula.py,
// written by tests/golden/make_monai_networks.py from the MONAI peer). Here medfast builds the
// same network, must have exactly those names and shapes, sets the same values and must give
// the same output. No weight file is checked in.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <random>
#include <nlohmann/json.hpp>

#include "medfast/core/config.hpp"
#include "medfast/core/error.hpp"
#include "medfast/nn/network.hpp"
#include "medfast/nn/pretrained.hpp"
#include "medfast/nn/unet.hpp"
#include "backend_check.hpp"
#include "test_util.hpp"

namespace medfast::nn {
namespace {

const nlohmann::json& reference() {
  static const nlohmann::json ref = [] {
    const std::string path = test::source_dir() + "/tests/reference/monai_networks.json";
    const std::string text = test::read_file(path);
    if (text.empty()) throw std::runtime_error("missing " + path);
    return nlohmann::json::parse(text);
  }();
  return ref;
}

// tests/golden/monai_formula.py, in C++.
std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 0;
  for (unsigned char c : name) h = (h * 131 + c) % 1000003;
  return h;
}

at::Tensor formula_values(const std::string& name, at::IntArrayRef shape) {
  const std::int64_t n = c10::multiply_integers(shape);
  std::vector<float> v(static_cast<std::size_t>(n));
  const double phase = static_cast<double>(name_hash(name)) * 1e-3;
  auto ends = [&](const std::string& s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  const bool var = ends("running_var"), mean = ends("running_mean"), bias = ends("bias");
  const double fan = shape.size() >= 2 ? static_cast<double>(n) / static_cast<double>(shape[0]) : 1.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double base = std::sin(static_cast<double>(i) * 0.7548776662466927 + phase);
    double x;
    if (var) x = 1.0 + 0.5 * std::abs(base);
    else if (mean) x = 0.1 * base;
    else if (shape.size() >= 2) x = base / std::sqrt(fan);
    else if (bias) x = 0.1 * base;
    else x = 0.75 + 0.25 * base;
    v[static_cast<std::size_t>(i)] = static_cast<float>(x);
  }
  return torch::from_blob(v.data(), shape, at::kFloat).clone();
}

at::Tensor formula_input(at::IntArrayRef shape) {
  const std::int64_t n = c10::multiply_integers(shape);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(std::sin(static_cast<double>(i) * 0.3183098861837907 + 0.5));
  return torch::from_blob(v.data(), shape, at::kFloat).clone();
}

std::map<std::string, at::Tensor> named_tensors(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> all;
  for (const auto& p : m.named_parameters(true)) all[p.key()] = p.value();
  for (const auto& b : m.named_buffers(true)) all[b.key()] = b.value();
  return all;
}

/// Compares an output with the reference's summary: shape, sum, sum of squares, strided sample.
void expect_output(const at::Tensor& y, const nlohmann::json& want, const std::string& what) {
  ASSERT_EQ(y.sizes().vec(), want["shape"].get<std::vector<std::int64_t>>()) << what;
  const at::Tensor flat = y.reshape({-1}).to(at::kDouble);
  const double n = static_cast<double>(flat.numel());
  const double sum = flat.sum().item<double>(), sum_sq = (flat * flat).sum().item<double>();
  EXPECT_NEAR(sum / n, want["sum"].get<double>() / n, 1e-5) << what << ": mean";
  EXPECT_NEAR(sum_sq, want["sum_sq"].get<double>(), 1e-4 * want["sum_sq"].get<double>()) << what << ": sum of squares";
  const std::int64_t stride = want["sample_stride"];
  const auto& sample = want["sample"];
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t k = 0; k < sample.size(); ++k) {
    const double d = std::abs(flat[static_cast<std::int64_t>(k) * stride].item<double>() - sample[k].get<double>());
    if (d > worst) worst = d, at = k;
  }
  EXPECT_LT(worst, 1e-4) << what << ": largest difference at sample " << at << " (element " << at * stride << ")";
}

class MonaiParity : public ::testing::TestWithParam<std::string> {};

TEST_P(MonaiParity, SameNamesShapesAndOutputAsMonai) {
  const auto& c = reference()["networks"][GetParam()];
  torch::manual_seed(0);
  torch::AutoGradMode no_grad(false);
  torch::nn::AnyModule net = make_network(c["model"], GetParam());
  auto tensors = named_tensors(*net.ptr());
  // Exactly MONAI's state_dict: every name, with its shape.
  std::size_t matched = 0;
  for (const auto& entry : c["state_dict"]) {
    const std::string name = entry[0];
    const auto shape = entry[1].get<std::vector<std::int64_t>>();
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      ADD_FAILURE() << "medfast has no tensor named MONAI's '" << name << "'";
      continue;
    }
    EXPECT_EQ(it->second.sizes().vec(), shape) << name;
    ++matched;
    if (it->second.is_floating_point()) it->second.copy_(formula_values(name, shape));
  }
  EXPECT_EQ(matched, tensors.size()) << "medfast has tensors MONAI's state_dict does not";
  net.ptr()->eval();
  const at::Tensor y = net.forward<at::Tensor>(formula_input(c["input_shape"].get<std::vector<std::int64_t>>()));
  expect_output(y, c["output"], GetParam());
  if (c.contains("train_output")) {  // deep supervision: the output and the heads, stacked
    net.ptr()->train();
    const at::Tensor stacked = net.forward<at::Tensor>(formula_input(c["input_shape"].get<std::vector<std::int64_t>>()));
    expect_output(stacked, c["train_output"], GetParam() + " (training mode)");
  }
}

// Models out (`medfast export`): the state_dict medfast writes is MONAI's (names in
// MONAI's order, shapes, dtypes, values), torch.load(weights_only=True) reads it in
// python3-torch, and model.pretrained reads it back bit for bit, giving MONAI's output.
TEST_P(MonaiParity, StateDictWrittenIsMonaisAndReadsBackBitForBit) {
  const auto& c = reference()["networks"][GetParam()];
  torch::AutoGradMode no_grad(false);
  torch::nn::AnyModule net = make_network(c["model"], GetParam());
  auto tensors = named_tensors(*net.ptr());
  for (const auto& entry : c["state_dict"]) {
    auto it = tensors.find(entry[0].get<std::string>());
    ASSERT_NE(it, tensors.end()) << entry[0];
    if (it->second.is_floating_point()) {
      it->second.copy_(formula_values(entry[0], entry[1].get<std::vector<std::int64_t>>()));
    }
  }
  test::TempDir dir;
  const std::string file = dir / "model.pt";
  EXPECT_GT(save_state_dict_file(file, *net.ptr()), 0u);
  const auto r = test::run(str(test::python(), " ", test::source_dir(), "/tests/golden/check_state_dict.py --case ",
                               GetParam(), " ", file));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  torch::manual_seed(3);
  torch::nn::AnyModule back = make_network(c["model"], GetParam());
  load_state_dict_file(file, *back.ptr());
  const auto written = named_tensors(*net.ptr()), read = named_tensors(*back.ptr());
  ASSERT_EQ(written.size(), read.size());
  for (const auto& [name, t] : written) EXPECT_TRUE(torch::equal(t, read.at(name))) << name << " changed on the way";
  back.ptr()->eval();
  expect_output(back.forward<at::Tensor>(formula_input(c["input_shape"].get<std::vector<std::int64_t>>())), c["output"],
                GetParam() + " read back");
}

// Inference (issue 26): a UNet's batch norm folded into the convolution before it gives
// MONAI's output (the golden) and the unfolded network's up to rounding; the folded copy has
// no batch norm, shares nothing with the trained network, and the others run as they are.
TEST(InferenceNetwork, BatchNormFoldedIntoTheConvolutionsGivesMonaisOutput) {
  const auto& c = reference()["networks"]["unet_res2_batch"];
  torch::AutoGradMode no_grad(false);
  torch::nn::AnyModule net = make_network(c["model"], "unet_res2_batch");
  for (auto& [name, t] : named_tensors(*net.ptr())) {
    if (t.is_floating_point()) t.copy_(formula_values(name, t.sizes()));
  }
  net.ptr()->eval();
  const at::Tensor x = formula_input(c["input_shape"].get<std::vector<std::int64_t>>());
  const at::Tensor want = net.forward<at::Tensor>(x);
  const auto before = named_tensors(*net.ptr());
  std::map<std::string, at::Tensor> kept;
  for (const auto& [name, t] : before) kept[name] = t.clone();

  torch::nn::AnyModule folded = inference_network(parse_network(c["model"], "model"), net);
  ASSERT_NE(folded.ptr().get(), net.ptr().get());
  std::size_t norms = 0, convolutions = 0;
  for (const auto& m : folded.ptr()->modules()) {
    norms += m->as<torch::nn::BatchNorm3dImpl>() != nullptr;
    convolutions += m->as<torch::nn::Conv3dImpl>() != nullptr || m->as<torch::nn::ConvTranspose3dImpl>() != nullptr;
  }
  EXPECT_EQ(norms, 0u);
  EXPECT_GT(convolutions, 10u);
  EXPECT_FALSE(folded.ptr()->is_training());
  for (const auto& p : folded.ptr()->parameters()) EXPECT_FALSE(p.requires_grad());
  const at::Tensor y = folded.forward<at::Tensor>(x);
  expect_output(y, c["output"], "folded");
  EXPECT_LT((y - want).abs().max().item<double>(), 2e-5 * std::max(1.0, want.abs().max().item<double>()));
  // The trained network is untouched, and training it on does not change the folded copy.
  for (const auto& [name, t] : named_tensors(*net.ptr())) EXPECT_TRUE(torch::equal(t, kept.at(name))) << name;
  for (auto& p : net.ptr()->parameters()) p.add_(1.0);
  EXPECT_TRUE(torch::equal(folded.forward<at::Tensor>(x), y));

  // Networks without batch norm run as they are.
  for (const std::string key : {"unet_res0_instance", "segresnet"}) {
    torch::nn::AnyModule other = make_network(reference()["networks"][key]["model"], key);
    EXPECT_EQ(inference_network(parse_network(reference()["networks"][key]["model"], key), other).ptr().get(),
              other.ptr().get())
        << key;
  }
  // A transposed convolution's output channels are its weight's second axis: a UNet whose
  // up-convolutions change the channel count (4 -> 2 at the top with batch norm: num_res_units 0).
  nlohmann::json plain = c["model"];
  plain["num_res_units"] = 0;
  torch::nn::AnyModule p0 = make_network(plain, "plain");
  for (auto& [name, t] : named_tensors(*p0.ptr())) {
    if (t.is_floating_point()) t.copy_(formula_values(name, t.sizes()));
  }
  p0.ptr()->eval();
  const at::Tensor p0_want = p0.forward<at::Tensor>(x);
  const at::Tensor p0_got = inference_network(parse_network(plain, "plain"), p0).forward<at::Tensor>(x);
  EXPECT_LT((p0_got - p0_want).abs().max().item<double>(), 2e-5 * std::max(1.0, p0_want.abs().max().item<double>()));
  EXPECT_THROW(fold_batch_norm(*std::dynamic_pointer_cast<UNetImpl>(make_network(reference()["networks"]["unet_res0_instance"]["model"], "i").ptr())),
               ValueError);
}

INSTANTIATE_TEST_SUITE_P(Networks, MonaiParity,
                         ::testing::Values("unet_res2_batch", "unet_res0_instance", "segresnet", "segresnet_deconv",
                                           "swinunetr_v1", "swinunetr_v2", "dynunet_aniso", "dynunet_res_ds",
                                           "dynunet_batch"));

// ---------------------------------------------------------------------------------------------
// model.pretrained: a state_dict written by python3-torch (tests/golden/write_state_dict.py,
// MONAI's names and order) loads by name and gives MONAI's output.

std::string write_state_dict(const std::string& dir, const std::string& key, const std::string& extra = "",
                             const std::string& name = "") {
  const std::string out = dir + "/" + (name.empty() ? key + ".pt" : name);
  const auto r = test::run(test::python() + " " + test::source_dir() + "/tests/golden/write_state_dict.py --case " + key +
                           " --out " + out + " " + extra);
  if (r.exit_code != 0) throw std::runtime_error("write_state_dict.py failed: " + r.err);
  return out;
}

TEST(Pretrained, MonaiStateDictLoadsThroughModelPretrained) {
  test::TempDir dir;
  for (const std::string key : {"unet_res2_batch", "segresnet", "swinunetr_v1", "dynunet_res_ds"}) {
    SCOPED_TRACE(key);
    const auto& c = reference()["networks"][key];
    nlohmann::json spec = c["model"];
    spec["pretrained"] = write_state_dict(dir.path(), key);
    torch::manual_seed(1);
    torch::nn::AnyModule net = make_network(spec, key);
    net.ptr()->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor y = net.forward<at::Tensor>(formula_input(c["input_shape"].get<std::vector<std::int64_t>>()));
    expect_output(y, c["output"], key);
  }
}

TEST(Pretrained, DataParallelPrefixIsStripped) {
  test::TempDir dir;
  const auto& c = reference()["networks"]["unet_res0_instance"];
  nlohmann::json spec = c["model"];
  spec["pretrained"] = write_state_dict(dir.path(), "unet_res0_instance", "--prefix module.");
  torch::nn::AnyModule net = make_network(spec, "model");
  net.ptr()->eval();
  torch::NoGradGuard no_grad;
  expect_output(net.forward<at::Tensor>(formula_input(c["input_shape"].get<std::vector<std::int64_t>>())), c["output"],
                "module. prefix");
}

std::string format_error(const std::function<void()>& f) { return test::error_of<FormatError>(f); }

TEST(Pretrained, MismatchesNameTheFileAndTheKeyAndChangeNothing) {
  test::TempDir dir;
  const auto& c = reference()["networks"]["unet_res2_batch"];
  const std::string good = write_state_dict(dir.path(), "unet_res2_batch");
  // Other arguments: the first tensor whose shape differs is named with both shapes.
  nlohmann::json wider = c["model"];
  wider["channels"] = {8, 8, 16, 32};
  torch::nn::AnyModule net = make_network(wider, "model");
  const at::Tensor before = net.ptr()->named_parameters()["model.0.conv.unit0.conv.weight"].clone();
  const std::string msg = format_error([&] { load_state_dict_file(good, *net.ptr()); });
  EXPECT_NE(msg.find(good), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model.0.conv.unit0.conv.weight' has shape [4, 1, 3, 3, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 1, 3, 3, 3]"), std::string::npos) << msg;
  EXPECT_TRUE(torch::equal(before, net.ptr()->named_parameters()["model.0.conv.unit0.conv.weight"])) << "changed";
  // A missing key.
  const std::string missing =
      write_state_dict(dir.path(), "unet_res2_batch", "--drop model.0.residual.bias", "missing.pt");
  torch::nn::AnyModule same = make_network(c["model"], "model");
  EXPECT_NE(format_error([&] { load_state_dict_file(missing, *same.ptr()); })
                .find("has no tensor 'model.0.residual.bias'"),
            std::string::npos);
  // A key the network does not have (SegResNet's state_dict into a UNet).
  const std::string seg = write_state_dict(dir.path(), "segresnet");
  EXPECT_NE(format_error([&] { load_state_dict_file(seg, *same.ptr()); }).find("has no tensor 'model.0"),
            std::string::npos);
  // Not a torch.save file at all, and a truncated one.
  const std::string text = dir.path() + "/notes.pt";
  test::write_file(text, "not a checkpoint");
  EXPECT_NE(format_error([&] { load_state_dict_file(text, *same.ptr()); }).find("not a torch.save file"),
            std::string::npos);
  const std::string bytes = test::read_file(good);
  const std::string cut = dir.path() + "/cut.pt";
  test::write_file(cut, bytes.substr(0, bytes.size() / 2));
  EXPECT_NE(format_error([&] { load_state_dict_file(cut, *same.ptr()); }).find(cut), std::string::npos);
  // A missing file is an OsError naming it; a config's pretrained must be a string.
  EXPECT_THROW(load_state_dict_file(dir.path() + "/nothing.pt", *same.ptr()), OsError);
  nlohmann::json bad = c["model"];
  bad["pretrained"] = 5;
  EXPECT_THROW(make_network(bad, "model"), ConfigError);
}

// The reader parses untrusted files: damaged ones (bytes of the pickle, the zip directory and
// the storages changed at random) load or fail with a FormatError naming the file; nothing
// else (no crash, no other exception: the sanitizer job runs this too).
// One flipped byte in a stored tensor (not in the pickle, whose damage the unpickler sees):
// libtorch's reader checks no CRC, so the file loaded and trained from a damaged weight. Every
// record's CRC-32 is checked before use; the message names the archive and the record.
TEST(Pretrained, ADamagedTensorRecordIsNamedByItsCrc) {
  test::TempDir dir;
  const std::string good = write_state_dict(dir.path(), "unet_res0_instance");
  const auto& c = reference()["networks"]["unet_res0_instance"];
  torch::nn::AnyModule net = make_network(c["model"], "model");
  load_state_dict_file(good, *net.ptr());  // the whole file is sound
  std::string bytes = test::read_file(good);
  // The first tensor record: "<archive>/data/0", its bytes after the local header's name.
  const std::size_t name = bytes.find("/data/0");
  ASSERT_NE(name, std::string::npos);
  const std::size_t header = bytes.rfind("PK\x03\x04", name);
  ASSERT_NE(header, std::string::npos);
  const auto u16 = [&](std::size_t at) {
    return static_cast<std::size_t>(static_cast<unsigned char>(bytes[at]) | static_cast<unsigned char>(bytes[at + 1]) << 8);
  };
  const std::size_t data = header + 30 + u16(header + 26) + u16(header + 28);
  bytes[data + 5] = static_cast<char>(bytes[data + 5] ^ 0x40);
  const std::string damaged = dir / "damaged.pt";
  test::write_file(damaged, bytes);
  const std::string m = test::error_of<FormatError>([&] { load_state_dict_file(damaged, *net.ptr()); });
  EXPECT_NE(m.find("pretrained weights " + damaged + ": record '"), std::string::npos) << m;
  EXPECT_NE(m.find("/data/0' is damaged: the archive gives CRC-32 "), std::string::npos) << m;
  // Cut short: named as such, before any tensor is read.
  test::write_file(damaged, bytes.substr(0, bytes.size() * 2 / 3));
  const std::string cut = test::error_of<FormatError>([&] { load_state_dict_file(damaged, *net.ptr()); });
  EXPECT_NE(cut.find(damaged), std::string::npos) << cut;
}

TEST(Pretrained, DamagedFilesFailCleanly) {
  test::TempDir dir;
  const std::string good = write_state_dict(dir.path(), "unet_res0_instance");
  const std::string bytes = test::read_file(good);
  const std::size_t pkl = bytes.find("data.pklPK") != std::string::npos ? 0 : bytes.find("data.pkl");
  ASSERT_NE(pkl, std::string::npos);
  const auto& c = reference()["networks"]["unet_res0_instance"];
  torch::nn::AnyModule net = make_network(c["model"], "model");
  std::mt19937 rng(7);
  int refused = 0, loaded = 0;
  for (int round = 0; round < 300; ++round) {
    std::string damaged = bytes;
    // Mostly the pickle (the first record after its local header), sometimes anywhere.
    const std::size_t lo = round % 3 ? pkl : 0, hi = round % 3 ? std::min(bytes.size(), pkl + 1200) : bytes.size();
    for (int k = 0; k < 1 + round % 4; ++k) {
      damaged[lo + rng() % (hi - lo)] = static_cast<char>(rng() % 256);
    }
    if (round % 10 == 9) damaged.resize(rng() % damaged.size());
    const std::string path = dir / "damaged.pt";
    test::write_file(path, damaged);
    try {
      load_state_dict_file(path, *net.ptr());
      ++loaded;
    } catch (const FormatError& e) {
      ++refused;
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "round " << round << ": not a FormatError: " << e.what();
    }
  }
  EXPECT_GT(refused, 100);
  std::printf("damaged files: %d refused, %d loaded\n", refused, loaded);
}

}  // namespace
}  // namespace medfast::nn
